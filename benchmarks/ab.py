"""Two versions of the runner side by side: `python -m benchmarks.ab OLD_TREE NEW_TREE`.

Each tree is a checkout of this repository (e.g. `git worktree add /tmp/old <commit>`, plus a `runner/conf -> ../conf`
link so the package resolves from it); each run is `python -m runner` with PYTHONPATH at that tree, MLflow off (the
training path only), interleaved with the order rotated, medians. Reports whole-process wall time and the training
call's throughput (examples over time/train_sec, from the run's `done:` line) for each side, and new / old.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.wall import ROWS, runner_argv


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


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.ab")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--global-batch", type=int, default=256)
    args = p.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="bench-ab-")
    trees = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
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
