"""The zoo's pattern names, in the order ``zoo.py all`` trains them (TensorFlow-free, for collection)."""

PATTERNS = ("cnn_dropout", "functional_skip", "custom_train_step", "vae", "gan", "bert_masking", "batchnorm",
            "tf_random_ops", "generator_layer", "mixed_precision", "tf_data", "py_dataset", "mlp_softmax", "transformer",
            "resnet_block", "lstm", "autoencoder", "custom_loop", "custom_loop_checkpointed")
