"""``tfrepro run --seed S`` gives one computation whatever the script imports first: Keras 3 and
tf_keras import modules that draw from Python's RNG before they import TensorFlow, and Keras 3's
seed state is still being imported when TensorFlow's import ends."""

import sys

import pytest

from tfrepro import _tf

from conftest import run_python, run_tfrepro

pytestmark = [pytest.mark.keras, pytest.mark.slow, pytest.mark.nightly]

LEGACY = _tf.keras_info().module == "tf_keras"
KERAS = "tf_keras" if LEGACY else "keras"
# What a script's first lines are, each ending with `keras` bound to the Keras that tf.keras is.
PREAMBLES = {
    f"import {KERAS}": f"import {KERAS} as keras\n",
    f"from {KERAS} import layers": f"from {KERAS} import layers\nimport {KERAS} as keras\n",
    "import tensorflow": "import tensorflow as tf\nkeras = tf.keras\n",
    "import numpy": "import numpy as np\nimport tensorflow as tf\nkeras = tf.keras\n",
}
BODY = """
import hashlib, random
import numpy as np
import tensorflow as tf
import tfrepro
x = np.random.rand(64, 8).astype("float32")
y = np.random.rand(64, 1).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.3),
                          keras.layers.Dense(1)])
model.compile(keras.optimizers.Adam(0.01), "mse")
model.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=True)
weights = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights())).hexdigest()
print(weights, random.random(), np.random.rand(), float(tf.random.uniform([])), tfrepro.status()["hooks"].ok)
"""


def test_every_first_import_gives_run_the_computation_of_an_in_script_patch(tmp_path):
    reference = tmp_path / "patched.py"
    reference.write_text("import tfrepro\ntfrepro.patch(9)\n" + PREAMBLES["import tensorflow"] + BODY)
    expected = run_python(str(reference))
    assert expected.returncode == 0, expected.stderr[-2000:]
    assert expected.stdout.split()[-1] == "True"  # every hook's target was found
    for name, preamble in PREAMBLES.items():
        script = tmp_path / f"first_{len(name)}.py"
        script.write_text(preamble + BODY)
        proc = run_tfrepro("run", "--seed", "9", "--", sys.executable, str(script))
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "ReproducibilityWarning" not in proc.stderr, (name, proc.stderr[-2000:])
        assert proc.stdout == expected.stdout, f"first line `{name}`: {proc.stdout} != {expected.stdout}"
