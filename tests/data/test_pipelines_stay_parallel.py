"""Under op determinism, TF's ``make_deterministic`` tf.data rewrite makes every parallel map,
interleave and prefetch of a pipeline sequential once any of its functions holds state that another
thread could touch (a variable read, a seed-generator resource). tfrepro's keyed pipelines must not
trigger it: the rewrite is read from TF's own log of it, in a fresh process, with a negative control
(a variable read in a map) that does trigger it."""

import pytest

from tfrepro import _tf

from conftest import clean_env, run_python

pytestmark = pytest.mark.keras

_SCRIPT = """
import os
import tfrepro
tfrepro.patch(0)
import tensorflow as tf
import tfrepro.data

def pipeline(files):
    def read(file):
        rows = tf.data.Dataset.range(16).map(lambda i: tf.cast(i, tf.float32) + tf.cast(file, tf.float32))
        return tfrepro.data.map_with_seed(rows, lambda x, seed: x + tf.random.stateless_uniform([], seed), key="noise")
    ds = tf.data.Dataset.range(files).interleave(read, cycle_length=2, num_parallel_calls=2, deterministic=True)
    ds = tfrepro.data.map_with_seed(tfrepro.data.shuffle(ds, 64), lambda x, seed: x * 2, key="double")
    return ds.map(lambda x: x + 1, num_parallel_calls=4).batch(8).prefetch(2)

from tfrepro.data.addressing import why_not_addressable
keyed = pipeline(4)  # the epoch clock first made inside interleave's function: no state update there
assert why_not_addressable(keyed) is None, why_not_addressable(keyed)
for _ in keyed:
    pass
# Dataset.shuffle keyed by patch, a draw of a fixed epoch in an interleave, and repeat() after them
fixed = tf.data.Dataset.range(2).interleave(lambda f: tfrepro.data.map_with_seed(
    tf.data.Dataset.range(8), lambda x, seed: x, key="fixed", epoch=3), num_parallel_calls=2, deterministic=True)
repeated = tf.data.Dataset.range(64).shuffle(64).map(lambda x: x * 2, num_parallel_calls=4).batch(8).repeat(2)
for _ in tf.data.Dataset.zip((repeated, fixed.batch(8).repeat())).prefetch(2):
    pass
os.write(2, b"-- fit's shuffle of arrays --\\n")
import numpy as np
keras = tf.keras
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(np.ones((64, 4), "float32"), np.ones((64, 1), "float32"), batch_size=8, epochs=2, verbose=0, shuffle=True)
os.write(2, b"-- the control: a variable read in a map --\\n")
offset = tf.Variable(1.0)
for _ in tf.data.Dataset.range(8).map(lambda i: tf.cast(i, tf.float32) + offset).map(
        lambda x: x * 2, num_parallel_calls=4).prefetch(2):
    pass
"""


@pytest.mark.slow
def test_keyed_pipelines_keep_their_parallel_maps_and_prefetch_under_op_determinism(tmp_path, keras):
    script = tmp_path / "pipelines.py"
    script.write_text(_SCRIPT)
    env = dict(clean_env(), TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="make_deterministic=2")
    proc = run_python(str(script), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keyed, rest = proc.stderr.split("-- fit's shuffle of arrays --")
    fit, control = rest.split("-- the control: a variable read in a map --")
    assert _rewrites(keyed) == [], "\n".join(_rewrites(keyed))
    if _tf.keras_major(keras) >= 3:  # Keras 2's orders are counted in variables: README, "Keyed randomness"
        assert _rewrites(fit) == [], "\n".join(_rewrites(fit))
    assert "because it introduces nondeterminism through asynchrony" in control  # the probe sees a rewrite


def _rewrites(log):
    return [line for line in log.splitlines() if "make_deterministic" in line and "Rewriting node" in line]
