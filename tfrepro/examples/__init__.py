"""Examples: the MNIST CNN as an unmodified training script, ``tfrepro demo``, and the digits data
(Keras MNIST, or scikit-learn's bundled digits offline). May import ``launching`` and below."""
