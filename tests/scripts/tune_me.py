"""A script tuned by `tfrepro tune`: reads its hyperparameters, trains a small Dense model on fixed
data, and prints the weights' SHA-256 (what a rerun must reproduce)."""

import hashlib

import numpy as np
import tensorflow as tf

import tfrepro

hp = tfrepro.tuning.hyperparameters(units=4, learning_rate=0.01)
rng = np.random.RandomState(0)
x = rng.rand(256, 8).astype("float32")
y = (x.sum(axis=1) > 4).astype("int64")
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(hp["units"], activation="relu"),
                             tf.keras.layers.Dropout(0.2), tf.keras.layers.Dense(2)])
model.compile(tf.keras.optimizers.Adam(hp["learning_rate"]), metrics=["accuracy"],
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, epochs=2, batch_size=32, validation_split=0.25, verbose=0)
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()
print("weights", digest)
