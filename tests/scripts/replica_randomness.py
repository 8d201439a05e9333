"""What a tf.random.Generator made in a strategy's scope, and a Keras Dropout layer, draw on each
replica, and what each replica's copy of a Keras 3 BatchNormalization's moving mean holds after a
step on its own part of the batch: prints one JSON line {"generator": [...], "dropout": [...],
"moving_mean": [...]} of this worker's replicas, per step ("moving_mean" is null on Keras 2, whose
moving statistics are read as the replicas' mean by design).

    python replica_randomness.py (multi-worker | mirrored)

multi-worker: MultiWorkerMirroredStrategy over the TF_CONFIG cluster (one replica per worker);
mirrored: MirroredStrategy over two logical CPU devices of this process.
"""

import json
import sys

import tensorflow as tf

if sys.argv[1] == "mirrored":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
keras = tf.keras
with strategy.scope():
    generator = tf.random.Generator.from_seed(5)
    dropout = keras.layers.Dropout(0.5)
    batch_norm = keras.layers.BatchNormalization()
    batch_norm.build((None, 3))
keras3 = hasattr(keras, "version") and keras.version().startswith("3")


def replica_step():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    part = tf.reshape(tf.range(12.0), [4, 3]) * tf.cast(replica + 1, tf.float32)  # each replica's own examples
    batch_norm(part, training=True)
    return generator.normal([4]), dropout(tf.ones([8]), training=True)


@tf.function
def draw():
    return strategy.run(replica_step)


draws = {"generator": [], "dropout": [], "moving_mean": None if not keras3 else []}
for step in range(2):
    numbers, masks = draw()
    draws["generator"].append([v.numpy().tolist() for v in strategy.experimental_local_results(numbers)])
    draws["dropout"].append([v.numpy().tolist() for v in strategy.experimental_local_results(masks)])
    if keras3:
        copies = strategy.experimental_local_results(batch_norm.moving_mean.value)
        draws["moving_mean"].append([copy.numpy().tolist() for copy in copies])
print(json.dumps(draws))
