"""How often a search picks a truly best configuration, at equal compute: plain KerasTuner
(``executions_per_trial`` 1, 3 and 5) against ``tfrepro.tuning``'s race, on real data.

The data: scikit-learn's handwritten digits (1,797 8x8 images, offline), 1,200 to train and 597 to
validate; the objective is KerasTuner's ``val_accuracy`` (its best epoch). The model: a Dense
network on the 64 pixels; eight configurations (units x learning rate x dropout), several of them
closer than the seed noise.

1. **The pool.** KerasTuner's own ``GridSearch`` runs each configuration on ``--pool`` seeds
   through ``RacingSearch`` (every execution under ``tfrepro.patched(seed)``): a table of real
   scores, one per (configuration, seed). Deterministic training makes each cell a function of its
   configuration and seed, so a search that draws seeds from the pool computes exactly what it
   would by training; one cell is retrained at the end and compared bit for bit.
2. **The truth, held out.** Each search draws its seeds from a random half of the pool; the other
   half is its truth, never seen by the search. A configuration is *truly best* when a Welch
   t-test over the held-out seeds does not put their top mean ahead of it (95%); the strict truth
   is that top alone.
3. **The searches**, ``--reps`` times each, over each grid and over both together (16
   configurations; N is the number of configurations):
     kt-1, kt-3, kt-5   KerasTuner over the grid with executions_per_trial=k: the best mean of k
                        fits (each configuration's own random seeds), kN fits
     race-3N, race-5N   ``tfrepro.tuning.race`` with budgets of 3N and 5N fits (common seeds)
   Reported: how often each picks a truly best configuration (and the top one), the mean regret
   (the top's pool mean minus the pick's), and for the race, how often a claim "A is better than B
   beyond seed noise" is wrong (A's true mean is not above B's) or is made on a pair the whole
   held-out seeds cannot separate, how often a truly best configuration is claimed worse, and how
   many configurations its best and tied hold (what it cannot rank).
4. **Equal configurations**: how often the race claims any difference among configurations that
   do not differ (synthetic normal scores, 1,000 races per size).

Not a test: nothing is asserted. About 2 s per fit on 2 CPU cores (the pool: --pool x 8 fits).

    python bench/tuning_search.py [--grid spread|close|both] [--pool 30] [--reps 200] [--tables DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

# Two grids of units x learning rate x dropout: "spread" has a tied top pair and the rest far
# below; "close" has every configuration within a few seed standard deviations of the others.
GRIDS = {"spread": ((16, 64), (0.001, 0.003), (0.0, 0.2)), "close": ((32, 64), (0.002, 0.004), (0.0, 0.2))}


def measure_pool(grid_name: str, pool: int, epochs: int) -> dict:
    """Every configuration on seeds 0..pool-1 through KerasTuner's GridSearch; one cell rerun."""
    import keras
    import keras_tuner as kt
    from sklearn.datasets import load_digits

    import tfrepro

    warnings.simplefilter("ignore", tfrepro.ReproducibilityWarning)
    units, rates, dropouts = GRIDS[grid_name]
    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float32"), digits.target
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]

    def build(hp):
        model = keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(hp.Choice("units", units), activation="relu"),
            keras.layers.Dropout(hp.Choice("dropout", dropouts)),
            keras.layers.Dense(10, activation="softmax"),
        ])
        model.compile(keras.optimizers.Adam(hp.Choice("learning_rate", rates)),
                      "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    folder = tempfile.mkdtemp(prefix="tfrepro-tuning-bench-")
    tuner = kt.GridSearch(build, objective="val_accuracy", directory=folder, project_name="pool", overwrite=True)
    grid = len(units) * len(rates) * len(dropouts)
    search = tfrepro.tuning.RacingSearch(tuner, budget=grid * pool, seeds_per_trial=pool, max_seeds=pool)
    start = time.perf_counter()
    result = search.search(x[:1200], y[:1200], epochs=epochs, batch_size=64, validation_data=(x[1200:], y[1200:]),
                           verbose=0)
    took = time.perf_counter() - start
    check = result.candidates[-1]
    seed = list(check.scores)[-1]
    search.rerun(check, seed)  # raises unless the retrained weights are the search's, bit for bit
    return {"configs": [c.config for c in result.candidates],
            "scores": [[c.scores[s] for s in range(pool)] for c in result.candidates],
            "fits": grid * pool, "seconds": took, "rerun": f"{check.name} seed {seed}: identical"}


def welch_separates(a: np.ndarray, b: np.ndarray) -> bool:
    from tfrepro.sweeps.statistics import compare_sweeps

    return bool(compare_sweeps(a, b).distinguishable)


def simulate(table: dict, reps: int) -> list[str]:
    """The searches, each on half of the pool's seeds (drawn afresh), judged by the other half."""
    from tfrepro.tuning import race

    scores = np.array(table["scores"])  # configuration x pool seed
    n_configs, pool = scores.shape
    half = pool // 2
    means = scores.mean(axis=1)
    top = int(np.argmax(means))
    lines = [f"pool: {n_configs} configurations x {pool} seeds = {table['fits']} fits by KerasTuner's GridSearch "
             f"in {table['seconds']:.0f} s; rerun check: {table['rerun']}",
             f"  {'configuration':<56} pool mean  seed std"]
    lines += [f"  {json.dumps(table['configs'][i]):<56} {means[i]:.4f}     {scores[i].std(ddof=1):.4f}"
              for i in np.argsort(-means)]
    gaps = np.sort(means)[::-1]
    lines.append(f"  median seed std {np.median(scores.std(axis=1, ddof=1)):.4f}; the top two pool means differ by "
                 f"{gaps[0] - gaps[1]:.4f}")
    rng = np.random.default_rng(2026)
    picks: dict[str, list[tuple[bool, bool, float, float]]] = {}
    claims: dict[str, list[int]] = {}  # claims, wrong way, on unseparable pairs, searches with a wrong one, ...
    best_sets = []
    for _ in range(reps):
        order = rng.permutation(pool)
        search, held = order[:half], order[half:]
        truth = scores[:, held].mean(axis=1)
        top = int(np.argmax(truth))
        truly_best = {i for i in range(n_configs) if i == top or not welch_separates(scores[i, held], scores[top, held])}
        best_sets.append(len(truly_best))

        def judged(pick: int, fits: float) -> tuple[bool, bool, float, float]:
            return pick in truly_best, pick == top, truth[top] - truth[pick], fits

        for k in (1, 3, 5):  # KerasTuner: each configuration's own random seeds, the best mean wins
            chosen = [scores[i, rng.choice(search, k, replace=False)].mean() for i in range(n_configs)]
            picks.setdefault(f"kt-{k}", []).append(judged(int(np.argmax(chosen)), k * n_configs))
        for k in (3, 5):  # the race at the same compute: common seeds
            name = f"race-{k * n_configs}"
            result = race(lambda config, seed: float(scores[config, seed]), list(range(n_configs)),
                          budget=k * n_configs, seeds=[int(s) for s in search], max_seeds=half, metric="val_accuracy")
            picks.setdefault(name, []).append(judged(result.best.config, result.spent))
            made = [(result.candidate(c.better).config, result.candidate(c.worse).config) for c in result.claims]
            wrong = sum(truth[a] <= truth[b] for a, b in made)
            tally = claims.setdefault(name, [0, 0, 0, 0, 0, 0])
            tally[0] += len(made)
            tally[1] += wrong
            tally[2] += sum(not welch_separates(scores[a, held], scores[b, held]) for a, b in made)
            tally[3] += wrong > 0
            tally[4] += any(b in truly_best for _, b in made)
            tally[5] += 1 + len(result.tied)
    lines.append(f"{reps} searches per method, each on {half} seeds drawn afresh from the pool, judged on the other "
                 f"{pool - half}; truly best (not separable from the held-out top, Welch 95%): "
                 f"{np.mean(best_sets):.1f} configurations on average")
    lines.append("  search    fits  picks a truly best  picks the top  mean regret (held-out mean shortfall)")
    for name, made in picks.items():
        best, exact, regret, fits = (np.mean([m[i] for m in made]) for i in range(4))
        lines.append(f"  {name:<8} {fits:5.1f}  {best:17.1%}  {exact:12.1%}  {regret:.5f}")
    for name, (made, wrong, unseparable, searches, beaten, size) in claims.items():
        lines.append(f"  {name}: {made / reps:.2f} claims per search, wrong way on the held-out seeds {wrong} of {made} "
                     f"({wrong / max(made, 1):.1%}; in {searches} of {reps} searches), on pairs the held-out seeds "
                     f"cannot separate {unseparable} ({unseparable / max(made, 1):.1%}); a truly best configuration "
                     f"claimed worse in {beaten} of {reps} searches; best + tied: {size / reps:.1f} configurations")
    return lines


def null_rates(races: int = 1000) -> list[str]:
    """How often the race claims a difference between configurations that do not differ: equal
    means, normal noise keyed by (race, seed, configuration)."""
    from tfrepro.tuning import race

    lines = [f"equal configurations ({races} races each, normal noise): races with any claim (5% nominal)"]
    for count, budget, max_seeds in ((4, 24, 10), (4, 40, 10), (4, 80, 20), (8, 40, 10), (8, 80, 20)):
        claimed = 0
        for salt in range(races):
            noise = lambda config, seed: float(np.random.default_rng([salt, seed, config]).normal(0.9, 0.01))
            claimed += bool(race(noise, list(range(count)), budget=budget, max_seeds=max_seeds).claims)
        lines.append(f"  {count} configurations, {budget} fits (max {max_seeds} seeds each): {claimed / races:.1%}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=[*GRIDS, "both"], default="both")
    parser.add_argument("--pool", type=int, default=30, help="seeds per configuration in the pool (default 30)")
    parser.add_argument("--reps", type=int, default=200, help="searches per method (default 200; at least 20)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--tables", type=Path, help="a folder: read each grid's pool from pool-GRID.json there if it "
                                                    "exists, else measure it and save it there")
    args = parser.parse_args()
    if args.reps < 20 or args.pool < 10:
        sys.exit("--reps must be at least 20 and --pool at least 10")
    tables = {}
    for grid in GRIDS if args.grid == "both" else [args.grid]:
        path = None if args.tables is None else args.tables / f"pool-{grid}.json"
        if path is not None and path.exists():
            tables[grid] = json.loads(path.read_text())
        else:
            tables[grid] = measure_pool(grid, args.pool, args.epochs)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(tables[grid]))
        print(f"== grid {grid!r}: 8 configurations")
        print("\n".join(simulate(tables[grid], args.reps)), flush=True)
    if len(tables) == 2:  # both grids at once: the same data, model and seeds, 16 configurations
        both = {key: tables["spread"][key] + tables["close"][key] for key in ("configs", "scores", "fits", "seconds")}
        both["rerun"] = f"{tables['spread']['rerun']}; {tables['close']['rerun']}"
        print("== both grids: 16 configurations")
        print("\n".join(simulate(both, args.reps)), flush=True)
    print("\n".join(null_rates()))


if __name__ == "__main__":
    main()
