"""Elastic training's costs, whole job, MLflow on: a 3-worker MultiWorkerMirrored job on localhost loses worker:1
(SIGKILL) after its first checkpoint, goes on with 2 and grows back to 3. A benchmark, not a test:

    python -m benchmarks.elastic [--rounds 3] [--executors fit,custom_loop] [--workers 3]

From each job's elastic/resizes.json (runner.launch.elastic): the seconds from the loss to the first logged step at
the smaller size (shrink), from the start of the regrowth to the first step at full size again (grow), and the steps
redone. Rounds alternate the executors, so a slow phase of the machine touches both.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers import ELASTIC  # noqa: E402  (tests/helpers.py: the elastic tests' training, shared)

JOB = [
    "strategy=multi_worker_mirrored",
    "cluster=localhost",
    "cross_device_ops=ring",
    "cluster.elastic.enabled=true",
    "cluster.elastic.rejoin_after_sec=0",
    *ELASTIC,
]


def one_job(workdir: Path, executor: str, workers: int) -> dict:
    run_dir = workdir / f"job-{executor}-{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "runner", *JOB, f"cluster.workers={workers}", f"executor={executor}"]
    argv += [f"hydra.run.dir={run_dir}", f"mlflow.tracking_uri=sqlite:///{workdir}/mlflow.db"]
    log_path = run_dir.with_suffix(".out")
    started = time.monotonic()
    with open(log_path, "w") as out:
        job = subprocess.Popen(argv, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
        victim = None
        while job.poll() is None:
            text = log_path.read_text()
            found = re.search(r"started worker:1 \(pid (\d+)\)", text)
            if victim is None and found and re.search(r"\[worker:0\].* epoch 2/12 step (8|12)/16", text):
                victim = int(found.group(1))
                os.kill(victim, signal.SIGKILL)
            time.sleep(0.05)
    wall = time.monotonic() - started
    if job.returncode != 0 or victim is None:
        raise SystemExit(f"the job failed (exit {job.returncode}); its output: {log_path}")
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    records = json.loads(Path(client.download_artifacts(run_id, "elastic/resizes.json", str(workdir))).read_text())
    lost, back = records[0], records[-1]
    return {"shrink": lost["resize_sec"], "grow": back["resize_sec"], "redone": lost["steps_redone"], "wall": wall}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--executors", default="fit,custom_loop")
    p.add_argument("--workers", type=int, default=3)
    args = p.parse_args(argv)
    executors = args.executors.split(",")
    got = {e: [] for e in executors}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for executor in executors if r % 2 == 0 else executors[::-1]:
                got[executor].append(one_job(Path(tmp), executor, args.workers))
                print(f"round {r + 1} {executor}: {got[executor][-1]}", file=sys.stderr, flush=True)
    print(f"{args.workers} workers, worker:1 killed after the first checkpoint, {args.rounds} round(s), medians (min-max)")
    print()
    print("| executor | training again on fewer (s) | on all again after the regrowth began (s) | steps redone | whole job (s) |")
    print("|---|---|---|---|---|")
    for executor, rows in got.items():

        def cell(key, digits=1):
            values = [row[key] for row in rows]
            return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"

        print(f"| {executor} | {cell('shrink')} | {cell('grow')} | {cell('redone', 0)} | {cell('wall')} |")


if __name__ == "__main__":
    main()
