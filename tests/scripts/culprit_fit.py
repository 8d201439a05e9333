"""An ordinary training script whose middle layer sums its gradient in an order from OS entropy (a CPU
stand-in for GPU atomics): no seed controls it. It never imports tfrepro. `--clean` swaps the layer
for its deterministic twin."""

import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for nondeterminism.py
from nondeterminism import make_layers  # noqa: E402

keras = tf.keras
dense, _ = make_layers(keras, tf)
x = np.linspace(0, 1, 192, dtype="float32").reshape(64, 3)
y = np.sin(x[:, :2] * 3)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="tanh", name="encoder"),
                          dense(6, shuffle="--clean" not in sys.argv, input_gradient=True, name="summing"),
                          keras.layers.Dense(2, name="head")])
model.compile(optimizer="adam", loss="mse")
model.fit(x, y, batch_size=16, epochs=2, verbose=0)
print("trained to the end")
