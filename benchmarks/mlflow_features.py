"""What issue 19's MLflow features cost a run, command to prompt: `python -m benchmarks.mlflow_features`.

The default run (`python -m runner`, MLflow on) with system metrics and the logged MLflow model each on and off,
interleaved with the order rotated each round, medians. Prints whole-process wall time and CPU time (the run and its
MLflow process) per variant, the on / off ratios, and the run's own `save` and `mlflow end` phases (the model is
logged in `save`, after model.keras is written; system metrics are stopped in `mlflow end`).
"""

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "both off": ["mlflow.system_metrics=false", "mlflow.log_model=false"],
    "system metrics on": ["mlflow.system_metrics=true", "mlflow.log_model=false"],
    "MLflow model on": ["mlflow.system_metrics=false", "mlflow.log_model=true"],
    "both on (default)": [],
}


def run(workdir: str, uri: str, overrides: list[str], extra: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    argv = [sys.executable, "-m", "runner", *overrides, *extra, f"mlflow.tracking_uri={uri}",
            f"hydra.run.dir={tempfile.mkdtemp(dir=workdir)}"]  # fmt: skip
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=workdir, env=env, timeout=900)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU time of the run and the processes it waited for (its MLflow process): the work added, whatever the load
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    out = proc.stdout + proc.stderr
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{out[-2000:]}")
    phases = dict((k, float(v)) for k, v in re.findall(r"(save|mlflow end|mlflow start) ([0-9.]+)s", out))
    return {"wall": wall, "cpu": cpu, **phases}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.mlflow_features")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runner-args", default="", help="more overrides for every run, space-separated")
    args = p.parse_args(argv)
    extra = args.runner_args.split()
    workdir = tempfile.mkdtemp(prefix="mlflow-features-")
    uri = f"sqlite:///{workdir}/mlflow.db"
    run(workdir, uri, VARIANTS["both off"], ["train.epochs=1", "train.steps_per_epoch=2"])  # creates the store once
    names = list(VARIANTS)
    results: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            results[name].append(run(workdir, uri, VARIANTS[name], extra))
            print(f"round {r + 1} {name}: {results[name][-1]}", file=sys.stderr, flush=True)

    def med(name, key):
        return statistics.median(x.get(key, float("nan")) for x in results[name])

    base = med("both off", "wall")
    cpu = med("both off", "cpu")
    print(f"| variant | wall s (median of {args.rounds}) | / both off | CPU s | / both off | save phase s | mlflow end s |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        print(f"| {name} | {med(name, 'wall'):.2f} | {med(name, 'wall') / base:.3f} | {med(name, 'cpu'):.2f} | "
              f"{med(name, 'cpu') / cpu:.3f} | {med(name, 'save'):.2f} | {med(name, 'mlflow end'):.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
