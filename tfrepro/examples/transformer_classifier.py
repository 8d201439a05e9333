"""keras-io's Transformer text classifier ("Text classification with Transformer"): token and
position embeddings, one Transformer block (MultiHeadAttention, Dropout, LayerNormalization and a
Dense feed-forward, each with a residual connection), global average pooling and a small Dense
head, with the example's sizes (width 32, 2 heads, feed-forward 32).

The example reads IMDB reviews, which need a download. Offline, ``as_tokens`` reads each MNIST
digit as a "sentence" of 49 tokens (its 4x4 patches' ink, in 16 levels), which the same model
learns to classify. The exact tier's tests and its cost bench train this model.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def build_model(keras, length: int = 49, vocabulary: int = 16, width: int = 32, heads: int = 2,
                feed_forward: int = 32, dropout: float = 0.1, num_classes: int = 10):
    """The classifier for sentences of ``length`` tokens below ``vocabulary``, built with ``keras``
    (Keras 3 or tf-keras)."""
    layers = keras.layers

    class TokenAndPositionEmbedding(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.tokens = layers.Embedding(vocabulary, width)
            self.positions = layers.Embedding(length, width)

        def call(self, x):
            return self.tokens(x) + self.positions(tf.range(tf.shape(x)[-1]))

    tokens = keras.Input((length,), dtype="int32")
    x = TokenAndPositionEmbedding()(tokens)
    attention = layers.MultiHeadAttention(num_heads=heads, key_dim=width)(x, x)
    x = layers.LayerNormalization(epsilon=1e-6)(x + layers.Dropout(dropout)(attention))
    forward = layers.Dense(width)(layers.Dense(feed_forward, activation="relu")(x))
    x = layers.LayerNormalization(epsilon=1e-6)(x + layers.Dropout(dropout)(forward))
    x = layers.Dropout(dropout)(layers.GlobalAveragePooling1D()(x))
    x = layers.Dropout(dropout)(layers.Dense(20, activation="relu")(x))
    return keras.Model(tokens, layers.Dense(num_classes, activation="softmax")(x))


def as_tokens(images: np.ndarray) -> np.ndarray:
    """28x28 digits (any leading shape that flattens to them) as 49 int32 tokens each: the mean ink
    of each 4x4 patch, in 16 levels."""
    patches = np.asarray(images).reshape(-1, 7, 4, 7, 4).mean(axis=(2, 4)).reshape(-1, 49)
    return np.minimum((patches * 16).astype("int32"), 15)
