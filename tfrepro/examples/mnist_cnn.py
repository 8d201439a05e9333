"""The classic Keras MNIST CNN, as an ordinary training script that knows nothing of tfrepro's patch.

Its input pipeline is the tf.data tutorials' recipe: shuffle, random augmentation (a shift and a
brightness change) in a parallel ``map`` with ``deterministic=False``, batch, prefetch. ``--seed S``
seeds it the usual way (``keras.utils.set_random_seed``), which is not enough: the parallel map
hands out the stateful random numbers in thread order. Run it twice under tfrepro and compare the
printed weight digests:

    tfrepro run --seed 42 -- python -m tfrepro.examples.mnist_cnn
    tfrepro run --seed 42 -- python -m tfrepro.examples.mnist_cnn

``--strategy multi-worker`` builds and trains it under ``tf.distribute.MultiWorkerMirroredStrategy``
(``TF_CONFIG`` names the cluster; ``tfrepro run --workers 2`` makes one on localhost);
``--strategy mirrored`` under ``MirroredStrategy`` on this machine's devices.

Data: MNIST from the Keras cache when present, else scikit-learn's bundled digits (offline).
"""

from __future__ import annotations

import argparse
import hashlib
import time

import numpy as np
import tensorflow as tf

from tfrepro.examples.datasets import load_mnist


def build_model(keras, num_classes: int = 10, dropout: bool = True):
    """Conv-Conv-MaxPool-Dropout-Flatten-Dense-Dropout-Dense, as in the Keras MNIST example
    (``dropout=False``: without the two Dropout layers)."""
    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(32, 3, activation="relu"),
        layers.Conv2D(64, 3, activation="relu"),
        layers.MaxPooling2D(2),
        *([layers.Dropout(0.25)] if dropout else []),
        layers.Flatten(),
        layers.Dense(128, activation="relu"),
        *([layers.Dropout(0.5)] if dropout else []),
        layers.Dense(num_classes, activation="softmax"),
    ])


def augment(image, label):
    """A random shift of up to 2 pixels and a random brightness change (stateful random ops)."""
    image = tf.image.random_crop(tf.image.pad_to_bounding_box(image, 2, 2, 32, 32), [28, 28, 1])
    return tf.image.random_brightness(image, 0.1), label


def training_data(x, y, batch_size: int):
    """The input pipeline of the tf.data tutorials and performance guide."""
    return (tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(len(x), reshuffle_each_iteration=True)
            .map(augment, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
            .batch(batch_size)
            .prefetch(tf.data.AUTOTUNE))


def weights_digest(model) -> str:
    """SHA-256 over every weight's raw bytes, in model order."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--limit", type=int, default=4096, help="training images to use (default 4096)")
    parser.add_argument("--offline", action="store_true", help="never try to download MNIST")
    parser.add_argument("--input", choices=("augmented", "arrays"), default="augmented",
                        help="augmented: the tf.data pipeline with random augmentation in a parallel map "
                             "(default); arrays: the arrays straight to fit(shuffle=True)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed the usual way, keras.utils.set_random_seed(SEED) (default: no seeds)")
    parser.add_argument("--strategy", choices=("none", "mirrored", "multi-worker"), default="none",
                        help="train under no tf.distribute strategy (default), MirroredStrategy, or "
                             "MultiWorkerMirroredStrategy (the cluster from TF_CONFIG)")
    parser.add_argument("--jit-compile", action="store_true", help="compile(jit_compile=True): train with XLA")
    parser.add_argument("--no-dropout", action="store_true", help="build the CNN without its Dropout layers")
    args = parser.parse_args(argv)
    strategy = {"none": tf.distribute.get_strategy, "mirrored": tf.distribute.MirroredStrategy,
                "multi-worker": tf.distribute.MultiWorkerMirroredStrategy}[args.strategy]()

    if args.seed is not None:
        tf.keras.utils.set_random_seed(args.seed)
    data = load_mnist(allow_download=not args.offline, limit=args.limit)
    print(f"data: {data.description}, {len(data.x_train)} training images")
    keras = tf.keras
    with strategy.scope():
        model = build_model(keras, dropout=not args.no_dropout)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      **({"jit_compile": True} if args.jit_compile else {}))
    start = time.perf_counter()
    if args.input == "augmented":
        inputs = {"x": training_data(data.x_train, data.y_train, args.batch_size)}
    else:
        inputs = {"x": data.x_train, "y": data.y_train, "batch_size": args.batch_size, "shuffle": True}
    history = model.fit(**inputs, epochs=args.epochs, validation_data=(data.x_test, data.y_test), verbose=2)
    print(f"fit time: {time.perf_counter() - start:.3f} s")
    for epoch, loss in enumerate(history.history["loss"]):
        print(f"epoch {epoch}: loss {float(loss)!r}")
    print(f"weights sha256: {weights_digest(model)}")


if __name__ == "__main__":
    main()
