"""Handwritten-digit data for examples and demos, with an offline path.

``load_mnist`` returns real MNIST from the Keras cache (or downloads it when the network allows),
and otherwise falls back to scikit-learn's bundled handwritten digits (1,797 real 8x8 scans,
shipped inside scikit-learn), placed on a 28x28 canvas so that the same MNIST models run on both.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("tfrepro")

MNIST_HOST = ("storage.googleapis.com", 443)


@dataclass(frozen=True)
class Digits:
    """Images (N, 28, 28, 1) float32 in [0, 1] and integer labels, with where they came from."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str  # "keras-mnist" or "sklearn-digits"
    description: str


def _keras_cache() -> Path:
    return Path(os.environ.get("KERAS_HOME", Path.home() / ".keras")) / "datasets" / "mnist.npz"


def _online(timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection(MNIST_HOST, timeout=timeout):
            return True
    except OSError:
        return False


def _prepare(images: np.ndarray) -> np.ndarray:
    return (images.astype("float32") / 255.0)[..., None]


def load_mnist(*, allow_download: bool = True, limit: int | None = None) -> Digits:
    """MNIST from the Keras cache, else downloaded (if ``allow_download`` and reachable), else
    scikit-learn's digits. ``limit`` caps the number of training images (test: ``limit // 4``)."""
    cache = _keras_cache()
    if cache.exists() or (allow_download and _online()):
        try:
            if cache.exists():
                with np.load(cache) as data:
                    arrays = data["x_train"], data["y_train"], data["x_test"], data["y_test"]
            else:
                from tensorflow import keras

                (xtr, ytr), (xte, yte) = keras.datasets.mnist.load_data()
                arrays = xtr, ytr, xte, yte
            x_train, y_train, x_test, y_test = arrays
            digits = Digits(_prepare(x_train), y_train.astype("int64"), _prepare(x_test), y_test.astype("int64"),
                            "keras-mnist", "MNIST (keras.datasets.mnist)")
            return _limited(digits, limit)
        except Exception as exc:  # a broken cache or download: the offline data still serves
            log.warning("could not load Keras MNIST (%s); using scikit-learn's digits instead", exc)
    return _limited(load_sklearn_digits(), limit)


def load_sklearn_digits() -> Digits:
    """scikit-learn's bundled handwritten digits, upscaled 3x to 24x24 and centred on 28x28."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise ImportError(
            'the offline digits need scikit-learn: pip install "tfrepro[demo]" (or pip install scikit-learn)'
        ) from exc
    bunch = load_digits()
    images = np.kron(bunch.images.astype("float32") / 16.0, np.ones((3, 3), dtype="float32"))
    canvas = np.zeros((len(images), 28, 28), dtype="float32")
    canvas[:, 2:26, 2:26] = images
    labels = bunch.target.astype("int64")
    split = 1500
    return Digits(canvas[:split, ..., None], labels[:split], canvas[split:, ..., None], labels[split:],
                  "sklearn-digits",
                  "scikit-learn's bundled handwritten digits (offline fallback; MNIST not in the Keras cache)")


def _limited(digits: Digits, limit: int | None) -> Digits:
    if limit is None:
        return digits
    test_limit = max(1, limit // 4)
    return Digits(digits.x_train[:limit], digits.y_train[:limit], digits.x_test[:test_limit],
                  digits.y_test[:test_limit], digits.source, digits.description)
