"""MultiWorkerMirroredStrategy across network namespaces (one "host" per worker, tests/netns_cluster.py), as clusters
of 2, 4 and 8 hosts form and train; and what a slow link (tbf) costs. Needs root; a benchmark, not a test:

    python -m benchmarks.netns_scale [--sizes 2 4 8] [--steps 100] [--batch-per-worker 64] [--rates 10mbit 2mbit]

Each worker runs `python -m runner strategy=multi_worker_mirrored cluster=tf_config cross_device_ops=ring
executor=custom_loop` in its namespace with TF_CONFIG naming the namespaces' addresses (MLflow, checkpoints and the
model save off: the figures are the cluster's). From each worker's `phases:` line and summary.json:

- formed (s): from launch until the last worker has built its strategy, data and model (imports included: N
  TensorFlow imports share the machine's cores);
- join (s): the build phase of the worker that finished importing last, which waits for nobody: what forming the
  cluster itself costs (coordination service registration, the strategy's first collective) plus data and model;
- step (ms): the chief's `summary/step_time_ms` (steps 2..N); all-reduce (ms): that minus the step time of one
  process (strategy=default) on the same per-worker batch.

On a machine with fewer cores than workers the step time measures CPU contention as much as the network: read the
growth with N with that in mind (docs/dev/benchmarks.md).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from netns_cluster import NetnsCluster, Tasks  # noqa: E402  (tests/netns_cluster.py, shared with tests/e2e/test_netns.py)

COMMON = [
    "executor=custom_loop",
    "mlflow.enabled=false",
    "checkpoint.enabled=false",
    "save_model=false",
    "train.epochs=1",
    "train.log_every_n_steps=20",
]
PHASE = re.compile(r"phases: imports ([\d.]+)s, mlflow start ([\d.]+)s, build ([\d.]+)s")


def _env():
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), RUNNER_LAUNCH_ID="netns-benchmark")
    return env


def single_process(steps: int, batch: int, root: Path) -> float:
    """Step time (ms) of one process with the default strategy on `batch` examples a step."""
    argv = [sys.executable, "-m", "runner", "strategy=default", *COMMON, f"train.steps_per_epoch={steps}",
            f"train.global_batch_size={batch}", f"data.num_examples={steps * batch}", f"hydra.run.dir={root}/single"]  # fmt: skip
    subprocess.run(argv, cwd=root, env=_env(), capture_output=True, text=True, timeout=300, check=True)
    return json.loads((root / "single" / "summary.json").read_text())["summary/step_time_ms"]


def cluster_run(n: int, steps: int, batch: int, root: Path, rate: str | None = None) -> dict:
    run_root = root / f"n{n}{'-' + rate if rate else ''}"
    run_root.mkdir(parents=True)
    args = ["strategy=multi_worker_mirrored", "cross_device_ops=ring", *COMMON, f"train.steps_per_epoch={steps}",
            f"train.global_batch_size={batch * n}", f"data.num_examples={steps * batch * n}"]  # fmt: skip
    with NetnsCluster(n) as netns:
        if rate:
            for i in range(n):
                netns.rate_limit(i, rate)

        def argv(job, i):
            return [sys.executable, "-m", "runner", "cluster=tf_config", *args, f"hydra.run.dir={run_root}/{job}-{i}"]

        launched = time.monotonic()
        tasks = Tasks(netns, {"worker": n}, argv, run_root, _env())
        codes = tasks.finish(timeout=600)
        wall = time.monotonic() - launched
        if set(codes.values()) != {0}:
            raise RuntimeError(f"{n} workers: exit codes {codes}\n{tasks.output('worker:0')[-3000:]}")
        phases = [tuple(map(float, PHASE.search(tasks.output(t)).groups())) for t in tasks.names]
        summary = json.loads((run_root / "worker-0" / "summary.json").read_text())
    last = max(phases, key=lambda p: p[0] + p[1])  # the last to finish importing waits for nobody
    return {
        "workers": n,
        "rate": rate or "unlimited",
        "formed_sec": max(sum(p) for p in phases),
        "join_sec": last[2],
        "step_ms": summary["summary/step_time_ms"],
        "examples_per_sec": summary["summary/examples_per_sec"],
        "wall_sec": wall,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.netns_scale")
    p.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-per-worker", type=int, default=64)
    p.add_argument("--rates", nargs="*", default=["10mbit", "2mbit"], help="tbf rates for the slow-link rows (2 workers)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("Error: benchmarks.netns_scale makes network namespaces and needs root.", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="netns-scale-") as tmp:
        root = Path(tmp)
        single = single_process(args.steps, args.batch_per_worker, root)
        print(f"one process, batch {args.batch_per_worker}: {single:.2f} ms/step", flush=True)
        runs = [(n, None) for n in args.sizes] + [(2, rate) for rate in args.rates]
        for n, rate in runs:
            row = cluster_run(n, args.steps, args.batch_per_worker, root, rate)
            row["all_reduce_ms"] = row["step_ms"] - single
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| workers | link | formed (s) | join (s) | step (ms) | all-reduce (ms) | examples/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['workers']} | {r['rate']} | {r['formed_sec']:.1f} | {r['join_sec']:.2f} | {r['step_ms']:.1f} | "
            f"{r['all_reduce_ms']:.1f} | {r['examples_per_sec']:,.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
