"""An ordinary training script: it never imports tfrepro and sets no seed."""

import hashlib
import random

import numpy as np
import tensorflow as tf

names = {f"layer-{i}" for i in range(64)}
print("set order:", ",".join(list(names)[:10]))
print("python random:", random.random())
print("numpy random:", np.random.rand())
print("tf random:", tf.random.uniform([4]).numpy().tobytes().hex())

keras = tf.keras
x = np.linspace(0, 1, 128, dtype="float32").reshape(64, 2)
y = (x[:, :1] > x[:, 1:]).astype("float32")
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dropout(0.5), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, y, batch_size=16, epochs=2, shuffle=True, verbose=0)
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights()))
print("weights:", digest.hexdigest())
