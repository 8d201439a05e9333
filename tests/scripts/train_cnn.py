"""Train a small CNN with Dropout and shuffling for a few steps; save the weights.

usage: train_cnn.py (patch SEED | none) OUT.npz
"""

import sys

if sys.argv[1] == "patch":
    import tfrepro

    tfrepro.patch(int(sys.argv[2]))
out = sys.argv[-1]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras
data = np.random.RandomState(1234)  # fixed data: only training randomness may differ
x = data.rand(192, 12, 12, 1).astype("float32")
y = data.randint(0, 4, size=192)
model = keras.Sequential([
    keras.Input((12, 12, 1)),
    keras.layers.Conv2D(8, 3, activation="relu"),
    keras.layers.MaxPooling2D(2),
    keras.layers.Dropout(0.3),
    keras.layers.Flatten(),
    keras.layers.Dense(16, activation="relu"),
    keras.layers.Dropout(0.3),
    keras.layers.Dense(4),
])
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=32, epochs=2, shuffle=True, verbose=0)
np.savez(out, *model.get_weights())
