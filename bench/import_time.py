"""Cost of `import tfrepro` (must not import TensorFlow; goal <= 0.2 s), measured in fresh processes
beside `import tensorflow` for scale. Prints the best of N runs of each."""

from __future__ import annotations

from _common import PYTHON, grab, run

CODE = ("import sys, time; t = time.perf_counter(); import {0}; "
        "print('seconds', time.perf_counter() - t, 'tf_loaded', 'tensorflow' in sys.modules)")


def best(module: str, reps: int) -> tuple[float, str]:
    outputs = [run([PYTHON, "-c", CODE.format(module)]) for _ in range(reps)]
    return min(grab(r"seconds ([\d.e-]+)", out) for out in outputs), outputs[0].split()[-1]


def main() -> None:
    tfrepro_s, tf_loaded = best("tfrepro", 10)
    tensorflow_s, _ = best("tensorflow", 3)
    print(f"import tfrepro: {tfrepro_s:.3f} s (goal <= 0.2 s), TensorFlow imported: {tf_loaded}; "
          f"import tensorflow: {tensorflow_s:.2f} s; ratio {tfrepro_s / tensorflow_s:.3f}")


if __name__ == "__main__":
    main()
