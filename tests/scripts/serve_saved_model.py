"""Serve a SavedModel that ``exact_train.py --export DIR`` wrote, in a process that cannot import
tfrepro, and print one JSON line: for each folder, how many of the 64 samples' outputs differ, in
batches of 1, 7 and 64 and in requests of mixed sizes, from the outputs the exporting process computed.

    python serve_saved_model.py DIR...
"""

import importlib.abc
import json
import os
import sys


class _NoTfrepro(importlib.abc.MetaPathFinder):
    """Any import of tfrepro fails, as in a process where it is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "tfrepro" or name.startswith("tfrepro."):
            raise ModuleNotFoundError(f"No module named {name!r} (this process serves without tfrepro)")
        return None


sys.meta_path.insert(0, _NoTfrepro())

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

def serve_folder(folder):
    x = np.load(os.path.join(folder, "inputs.npy"))
    exported = np.load(os.path.join(folder, "outputs.npy"))
    loaded = tf.saved_model.load(os.path.join(folder, "model"))
    if hasattr(loaded, "serve"):  # Keras 3's export
        serve = loaded.serve
    else:  # tf.saved_model.save of a tf-keras model
        signature = loaded.signatures["serving_default"]
        serve = lambda batch: next(iter(signature(batch).values()))  # noqa: E731

    def predict(sizes):
        start = np.cumsum([0, *sizes])
        return np.concatenate([np.asarray(serve(tf.constant(x[a:b]))) for a, b in zip(start[:-1], start[1:])])

    outputs = {"1": predict([1] * 64), "7": predict([7] * 9 + [1]), "64": predict([64]),
               "mixed": predict([7, 7, 1, 7, 7, 7, 7, 7, 7, 7])}
    return {name: int(sum(out[i].tobytes() != exported[i].tobytes() for i in range(len(x))))
            for name, out in outputs.items()}


print(json.dumps({"differing": {folder: serve_folder(folder) for folder in sys.argv[1:]},
                  "tfrepro_imported": any(name.split(".")[0] == "tfrepro" for name in sys.modules)}))
