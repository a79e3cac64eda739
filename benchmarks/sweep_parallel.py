"""A sweep of jobs of unequal length, whole-process wall time: one after another, Hydra's joblib launcher in batches of
N (what a sweep had before sweep.parallel), and sweep.parallel=N (the next job starts the moment any ends).

    python -m benchmarks.sweep_parallel                # 3 interleaved rounds, N=2; ~8 min on 2 cores
    python -m benchmarks.sweep_parallel --quick        # one round of short jobs: checks that it runs

The jobs are the default MLP on data=ones, each one epoch of its own length (--steps: one long job, then short
ones), so a batch of N waits for its longest job while its other slots idle. For each side: the median wall time
from the command to the prompt, and for sweep.parallel its ideal, the sum of its own jobs' times (from each job's
start to its end, the sweep's job records) divided by N.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def sides(n: int) -> dict[str, list[str]]:
    return {
        "one after another": [],
        f"joblib, batches of {n}": ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={n}"],
        f"sweep.parallel={n}": [f"sweep.parallel={n}"],
    }


def run(side: list[str], steps: list[int], root: str, tag: str) -> tuple[float, float]:
    """(wall seconds, sum of the jobs' own seconds)."""
    sweep_dir = os.path.join(root, tag)
    argv = [sys.executable, "-m", "runner", "-m", *side, "data=ones", "train.epochs=1", "checkpoint.enabled=false"]
    argv += [f"train.steps_per_epoch={','.join(map(str, steps))}", f"hydra.sweep.dir={sweep_dir}"]
    argv += [f"mlflow.tracking_uri=sqlite:///{root}/mlflow.db", "save_model=false"]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode:
        sys.exit(f"{' '.join(argv)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    jobs = [json.load(open(p)) for p in glob.glob(os.path.join(sweep_dir, ".runner", "job-*.json"))]
    return wall, sum(j["ended"] - j["started"] for j in jobs if "ended" in j)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.sweep_parallel")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", default="40000,6000,6000,6000,6000,6000", help="each job's steps (one epoch)")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    steps = [200, 20, 20] if args.quick else [int(s) for s in args.steps.split(",")]
    rounds = 1 if args.quick else args.rounds
    named = sides(args.parallel)
    walls = {name: [] for name in named}
    ideal = []
    with tempfile.TemporaryDirectory(prefix="sweep-parallel-") as root:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "runner",
                "train.steps=5",
                f"mlflow.tracking_uri=sqlite:///{root}/mlflow.db",
                f"hydra.run.dir={root}/warm",
            ],
            cwd=root,
            capture_output=True,
        )  # fmt: skip  (the store's migrations)
        for r in range(rounds):
            order = list(named)[r % len(named) :] + list(named)[: r % len(named)]  # rotated each round
            for i, name in enumerate(order):
                wall, jobs = run(named[name], steps, root, f"r{r}-{i}")
                walls[name].append(wall)
                if name.startswith("sweep.parallel"):
                    ideal.append(jobs / args.parallel)
                print(f"round {r + 1}: {name}: {wall:.1f} s", flush=True)
    print(f"\njobs of {', '.join(map(str, steps))} steps, {rounds} round(s), median whole-process wall time:")
    base = statistics.median(walls["one after another"])
    for name, times in walls.items():
        print(f"  {name:24s} {statistics.median(times):7.1f} s   {base / statistics.median(times):.2f}x one after another")
    print(f"  ideal of sweep.parallel (its jobs' own times summed / {args.parallel}): {statistics.median(ideal):.1f} s")


if __name__ == "__main__":
    main()
