"""`tfrepro doctor` end to end on unmodified scripts, in fresh processes."""

import json
import sys

import pytest

from conftest import SCRIPTS, run_tfrepro

pytestmark = pytest.mark.keras
CULPRIT = str(SCRIPTS / "culprit_fit.py")
DEMO = ["-m", "tfrepro.examples.mnist_cnn", "--offline", "--limit", "256", "--epochs", "1"]


@pytest.mark.slow
def test_doctor_names_the_nondeterministic_layer_and_stops_the_script(tmp_path):
    proc = run_tfrepro("doctor", "--out", str(tmp_path), "--", sys.executable, CULPRIT)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("2 problem(s) found (1 nondeterministic, 1 risk")  # the risk: the layer's Python
    assert lines[1].startswith("[nondeterministic] summing: the gradient it passes back")
    assert any(line.startswith("[downstream] encoder:") for line in lines)
    assert "head" not in proc.stdout
    saved = json.loads((tmp_path / "diagnosis.json").read_text())["diagnosis"]
    assert saved["clean"] is False and saved["findings"][0]["where"] == "summing"
    assert "trained to the end" not in (tmp_path / "stdout.log").read_text()  # stopped at the first fit
    assert "\x1b[" not in proc.stdout  # piped: plain text


@pytest.mark.slow
def test_doctor_on_the_demo_example_is_clean_and_without_patch_it_is_not(tmp_path):
    proc = run_tfrepro("doctor", "--out", str(tmp_path / "patched"), "--", sys.executable, *DEMO)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.startswith("clean: nothing found")
    assert "map(augment): runs in parallel with stateful random ops" in proc.stdout  # a note: serial, not wrong
    proc = run_tfrepro("doctor", "--no-patch", "--repeats", "0", "--out", str(tmp_path / "plain"), "--",
                       sys.executable, *DEMO)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "[risk] configuration: op determinism is off" in proc.stdout
    assert "[risk] input pipeline: map(augment): runs in parallel with stateful random ops" in proc.stdout
    assert "static scan only" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--repeats", "1", "--", sys.executable, CULPRIT], "--repeats must be 0"),
    (["--tf-version", "latest", "--", sys.executable, CULPRIT], "--tf-version: not a TensorFlow version"),
    (["--tf-version", "9.9", "--", sys.executable, CULPRIT], "--tf-version: TF 9.9 is outside the versions the kernel "
                                                             "table covers (TF 2.0-2."),
    (["--"], "no command given"),
    (["--", "python", "missing.py"], "script not found"),
])
def test_bad_input_is_one_line_exit_2_and_no_folder(tmp_path, args, message):
    out = tmp_path / "out"
    proc = run_tfrepro("doctor", "--out", str(out), *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not out.exists()


def test_a_script_that_never_fits_or_fails_exits_2(tmp_path):
    no_fit = tmp_path / "no_fit.py"
    no_fit.write_text("print('no training here')\n")
    proc = run_tfrepro("doctor", "--out", str(tmp_path / "a"), "--", sys.executable, str(no_fit))
    assert proc.returncode == 2 and "never called Model.fit" in proc.stdout
    failing = tmp_path / "failing.py"
    failing.write_text("raise SystemExit('broken before training')\n")
    proc = run_tfrepro("doctor", "--out", str(tmp_path / "b"), "--", sys.executable, str(failing))
    assert proc.returncode == 2 and "failed with exit code 1 before its first Model.fit" in proc.stdout
    assert "broken before training" in proc.stdout


@pytest.mark.slow
def test_continue_hands_a_generator_back_to_fit_whole(tmp_path):
    script = tmp_path / "generator_fit.py"
    script.write_text("""
import numpy as np
import tensorflow as tf

def batches():
    for step in range(6):
        yield np.full((4, 3), step, "float32"), np.ones((4, 1), "float32")

class Count(tf.keras.callbacks.Callback):
    seen = 0

    def on_train_batch_end(self, batch, logs=None):
        Count.seen += 1

model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(batches(), epochs=1, verbose=0, callbacks=[Count()])
print("steps", Count.seen)
""")
    proc = run_tfrepro("doctor", "--continue", "--out", str(tmp_path / "out"), "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "steps 6" in (tmp_path / "out" / "stdout.log").read_text()  # the batch the diagnosis read was given back


@pytest.mark.slow
def test_doctor_runs_a_custom_train_step_as_fit_runs_it(tmp_path):
    """The keras-io custom step, fed a dataset that yields x alone: `check` sees its runs diverge, and
    doctor names the layer instead of reporting clean."""
    script = tmp_path / "custom_step.py"
    script.write_text(f"""
import sys
import numpy as np
import tensorflow as tf
sys.path.insert(0, {str(SCRIPTS.parent)!r})
from nondeterminism import make_layers

keras = tf.keras
dense, _ = make_layers(keras, tf)

class Autoencoder(keras.Model):
    def train_step(self, x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(x - self(x, training=True)))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return {{"reconstruction": loss}}

inputs = keras.Input((3,))
hidden = dense(6, name="summing")(keras.layers.Dense(8, activation="tanh", name="encoder")(inputs))
model = Autoencoder(inputs, keras.layers.Dense(3, name="decoder")(hidden))
model.compile(optimizer="adam")
x = np.linspace(0, 1, 192, dtype="float32").reshape(64, 3)
model.fit(tf.data.Dataset.from_tensor_slices(x).batch(16), epochs=1, verbose=0)
""")
    proc = run_tfrepro("doctor", "--out", str(tmp_path / "out"), "--", sys.executable, str(script))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "[nondeterministic] summing: its weights' gradients varied" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_every_fit_diagnoses_each_fit_and_names_the_culprit_in_the_second(tmp_path):
    """A script that fits the deterministic twin, then the culprit: ``--every-fit`` finds the first fit
    clean (the negative control) and the culprit in the second."""
    script = tmp_path / "two_fits.py"
    script.write_text(f"import runpy, sys\nsys.argv = ['culprit_fit.py', '--clean']\nrunpy.run_path({CULPRIT!r})\n"
                      f"sys.argv = ['culprit_fit.py']\nrunpy.run_path({CULPRIT!r})\n")
    every = run_tfrepro("doctor", "--every-fit", "--out", str(tmp_path / "every"), "--", sys.executable, str(script))
    assert every.returncode == 1, every.stdout + every.stderr[-3000:]
    assert "Model.fit call 0:" in every.stdout and "Model.fit call 1:" in every.stdout
    reports = [json.loads((tmp_path / "every" / name).read_text())["diagnosis"]["findings"]
               for name in ("diagnosis.json", "diagnosis-1.json")]
    assert not [f for f in reports[0] if f["severity"] == "nondeterministic"]
    blamed = [f["where"] for f in reports[1] if f["severity"] == "nondeterministic"]
    assert blamed and blamed[0].startswith("summing"), reports[1]
    assert (tmp_path / "every" / "stdout.log").read_text().count("trained to the end") == 2
    crashing = tmp_path / "crashing.py"  # the clean fit, then a crash before the next: not every fit was seen
    crashing.write_text(f"import runpy, sys\nsys.argv = ['culprit_fit.py', '--clean']\nrunpy.run_path({CULPRIT!r})\n"
                        "raise SystemExit(3)\n")
    (tmp_path / "crash").mkdir()
    (tmp_path / "crash" / "diagnosis-notes.json").write_text("{}")  # the user's file, not a stale report
    crashed = run_tfrepro("doctor", "--every-fit", "--out", str(tmp_path / "crash"), "--", sys.executable, str(crashing))
    assert crashed.returncode == 2 and "failed with exit code 3" in crashed.stdout, crashed.stdout
    assert (tmp_path / "crash" / "diagnosis-notes.json").exists()
