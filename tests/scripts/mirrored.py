"""Record and compare training under tf.distribute.MirroredStrategy on two logical CPU devices."""

import json

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import tfrepro  # noqa: E402

tfrepro.patch(3)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x = np.random.RandomState(0).rand(64, 4).astype("float32")
y = x.sum(axis=1, keepdims=True)


def train():
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dropout(0.3), tf.keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)


result = tfrepro.verify(train, runs=2, seed=3)
print(json.dumps({"replicas": strategy.num_replicas_in_sync, "identical": result.identical,
                  "records": result.comparisons[0].records_compared}))
