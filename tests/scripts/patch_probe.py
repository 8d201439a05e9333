"""Fresh-process probes of patch(): prints one JSON object with the warnings and results."""

import json
import sys
import warnings

mode = sys.argv[1]
warnings.simplefilter("always")
result = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import tfrepro

    if mode == "hashseed":
        tfrepro.patch(5)
    elif mode == "late":
        import tensorflow as tf

        tf.constant(1.0) + 1.0  # starts TF's runtime
        layer = tf.keras.layers.Dense(2)
        tfrepro.patch(1, threads=3, onednn=False)
    elif mode == "no_tf":
        sys.modules["tensorflow"] = None  # makes `import tensorflow` fail as if not installed
        try:
            tfrepro.patch(1)
        except ImportError as exc:
            result["error"] = str(exc)
    elif mode == "import":
        tfrepro.status()
        tfrepro.derive_seed(1, "x")
        result["modules"] = sorted(m for m in ("tensorflow", "keras", "tf_keras", "numpy", "rich") if m in sys.modules)
    elif mode == "threads":
        report = tfrepro.patch(2, threads=1)
        import tensorflow as tf

        result["threads"] = [tf.config.threading.get_intra_op_parallelism_threads(),
                             tf.config.threading.get_inter_op_parallelism_threads()]
        result["report"] = report["thread pools"].value
result["warnings"] = [str(w.message) for w in caught if issubclass(w.category, tfrepro.ReproducibilityWarning)]
print(json.dumps(result))
