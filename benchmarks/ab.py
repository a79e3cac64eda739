"""Two versions of the runner side by side: `python -m benchmarks.ab OLD_TREE NEW_TREE`.

Each tree is a checkout of this repository (e.g. `git worktree add /tmp/old <commit>`, plus a `runner/conf -> ../conf`
link so the package resolves from it); each run is `python -m runner` with PYTHONPATH at that tree, MLflow off (the
training path only), interleaved with the order rotated, medians. Reports whole-process wall time and the training
call's throughput (examples over time/train_sec, from the run's `done:` line) for each side, and new / old.

`--sweep`: benchmarks.wall's sweep row for both trees (MLflow on, one store): OLD's sweep, NEW's sweep and NEW's jobs
typed one by one, interleaved with the order rotated, medians; "sweep / one by one" is the one-by-one time over the
sweep's (1.0: the sweep costs nothing of its own).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.wall import ROWS, SWEEP, SWEEP_STEPS, Wall, runner_argv, sweep_args


def run(tree, workdir, strategy, cpus, executor, steps, gbs):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = tree
    argv = [*runner_argv(strategy, cpus, executor, steps, gbs), "mlflow.enabled=false",
            f"hydra.run.dir={tempfile.mkdtemp(dir=workdir)}"]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=workdir, env=env, timeout=1800)
    wall = time.perf_counter() - started
    out = proc.stdout + proc.stderr
    if proc.returncode:
        raise RuntimeError(f"{tree}: {' '.join(argv)} failed:\n{out[-2000:]}")
    train = float(re.search(r"training ([0-9.]+)s", out).group(1))
    return wall, steps * gbs / train


def sweeps(trees: dict, rounds: int) -> None:
    """The sweep row, OLD and NEW side by side, into one store (the processes find the runner at each tree)."""
    wall = Wall(tempfile.mkdtemp(prefix="bench-ab-sweep-"), 0)
    sides = {f"sweep, {side}": (lambda t=tree: _at(t, lambda: wall.sweep(SWEEP, SWEEP_STEPS))) for side, tree in trees.items()}
    sides["one by one, new"] = lambda: _at(trees["new"], lambda: wall.one_by_one(SWEEP, SWEEP_STEPS))
    sides["one by one, new"]()  # once before the rounds: the store is created and migrated, the files cached
    names, got = list(sides), {name: [] for name in sides}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            got[name].append(sides[name]()[0])
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:.2f} s" for n, v in got.items()), file=sys.stderr, flush=True)
    med = {name: statistics.median(v) for name, v in got.items()}
    single = med["one by one, new"]
    print(f"`python -m runner -m {' '.join(sweep_args(SWEEP, SWEEP_STEPS))}`, MLflow on, {rounds} interleaved rounds, medians\n")
    print("| sweep, old (s) | sweep, new (s) | one by one (s) | sweep / one by one, old | new |")
    print("|---|---|---|---|---|")
    print(f"| {med['sweep, old']:.2f} | {med['sweep, new']:.2f} | {single:.2f} | {single / med['sweep, old']:.3f} | "
          f"{single / med['sweep, new']:.3f} |")  # fmt: skip


def _at(tree: str, measure):
    """`measure()` with PYTHONPATH at `tree` for the processes it starts."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = tree
    try:
        return measure()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.ab")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--sweep", action="store_true", help="the sweep row (benchmarks.wall's) instead of the rows")
    args = p.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="bench-ab-")
    trees = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    if args.sweep:
        return sweeps(trees, args.rounds)
    got = {(row, side): [] for row in ROWS for side in trees}
    for r in range(args.rounds):
        for i, row in enumerate(ROWS):
            sides = list(trees) if (r + i) % 2 == 0 else list(reversed(trees))
            for side in sides:
                got[row, side].append(run(trees[side], workdir, *row, args.steps, args.global_batch))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"{args.steps} steps x global batch {args.global_batch}, MLflow off, {args.rounds} interleaved rounds, medians\n")
    print("| strategy | executor | old wall (s) | new wall (s) | speed new / old | old examples/s | new examples/s | new / old |")
    print("|---|---|---|---|---|---|---|---|")
    for row in ROWS:
        walls = {s: statistics.median(w for w, _ in got[row, s]) for s in trees}
        rates = {s: statistics.median(e for _, e in got[row, s]) for s in trees}
        print(f"| {row[0]} ({row[1]}) | {row[2]} | {walls['old']:.2f} | {walls['new']:.2f} | {walls['old'] / walls['new']:.3f} "
              f"| {rates['old']:,.0f} | {rates['new']:,.0f} | {rates['new'] / rates['old']:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
