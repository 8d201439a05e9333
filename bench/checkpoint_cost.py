"""Cost of ``tfrepro.ReproCheckpoint`` on the Keras MNIST CNN, on CPU, beside one training epoch, in one run.

Measures, after a warm-up epoch, the median over rounds of:
  epoch       one fit epoch (batch 64) without the callback
  epoch+ckpt  the same with ReproCheckpoint(save_freq="epoch"): the difference is the epoch-end checkpoint
  save        one checkpoint alone: reading every variable (model, optimizer, metrics) and the RNG
              states, and writing the file (atomic, fsynced); what each epoch end adds
  replay      drawing one epoch of batches from the input without training: what a resume costs per
              epoch it goes back over (a lower bound: without Keras's loop and hooks)
and the checkpoint's size. The two fits alternate which goes first. Ratios are against the plain
epoch. Not a test: nothing is asserted.

    python bench/checkpoint_cost.py [--rounds 5] [--limit 4096]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _common import patched_mnist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--limit", type=int, default=4096, help="training images (default 4096, the example's)")
    args = parser.parse_args()

    tfrepro, tf, data = patched_mnist(args.limit)
    from tfrepro.checkpointing import model_state, storage
    from tfrepro.examples.mnist_cnn import build_model, training_data

    keras = tf.keras
    dataset = training_data(data.x_train, data.y_train, 64)
    model = build_model(keras)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(dataset, epochs=1, verbose=0)  # warm-up: traces, optimizer slots
    folder = Path(tempfile.mkdtemp(prefix="tfrepro-ckpt-bench-"))
    times: dict[str, list[float]] = {"epoch": [], "epoch+ckpt": [], "save": [], "replay": []}
    try:
        for round_ in range(args.rounds):
            for arm in ("epoch", "epoch+ckpt") if round_ % 2 == 0 else ("epoch+ckpt", "epoch"):
                callbacks = [tfrepro.ReproCheckpoint(folder / f"r{round_}")] if arm == "epoch+ckpt" else []
                start = time.perf_counter()
                model.fit(dataset, epochs=1, verbose=0, callbacks=callbacks)
                times[arm].append(time.perf_counter() - start)
            latest = storage.latest(folder / f"r{round_}")
            start = time.perf_counter()
            model_state.values(model_state.slots(model))
            tfrepro.rng_state()
            storage.write(folder / "alone", latest.manifest, latest.members, keep=1)
            times["save"].append(time.perf_counter() - start)

            start = time.perf_counter()
            for _ in iter(dataset):
                pass
            times["replay"].append(time.perf_counter() - start)
        size = storage.list_checkpoints(folder / "alone")[-1].stat().st_size
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    median = {name: statistics.median(values) for name, values in times.items()}
    epoch = median["epoch"]
    print(f"MNIST CNN, {len(data.x_train)} images ({data.source}), batch 64, {model.count_params():,} parameters, TF {tf.__version__}, "
          f"median of {args.rounds}")
    print(f"  one epoch                        {epoch:7.3f} s")
    print(f"  one epoch with ReproCheckpoint   {median['epoch+ckpt']:7.3f} s  {median['epoch+ckpt'] / epoch:.3f}x "
          "(one save, at the epoch's end)")
    print(f"  one checkpoint save              {median['save']:7.3f} s  {median['save'] / epoch:.3f}x  "
          f"({size / 1e6:.1f} MB)")
    print(f"  drawing one epoch's input        {median['replay']:7.3f} s  {median['replay'] / epoch:.3f}x "
          "(what a resume replays per epoch, without Keras's loop)")


if __name__ == "__main__":
    main()
