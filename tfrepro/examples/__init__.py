"""Examples: the MNIST CNN as an unmodified training script, keras-io's Transformer text classifier
(reading digits as tokens), ``tfrepro demo``, and the digits data
(Keras MNIST, or scikit-learn's bundled digits offline). May import ``launching`` and below."""
