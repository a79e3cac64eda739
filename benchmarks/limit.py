"""The runner's training throughput against the machine's limit: the same model's math in a tight loop.

    python -m benchmarks.limit                                  # both models, fit and custom_loop, 3 rounds
    python -m benchmarks.limit --strategy mirrored --logical-cpus 2
    python -m benchmarks.limit --strategy multi_worker_mirrored --workers 2   # cluster=localhost, 2 processes
    python -m benchmarks.limit --quick                          # one round, short runs: checks that it runs
    git worktree add /tmp/before COMMIT && python -m benchmarks.limit --against /tmp/before   # before / after
    python -m benchmarks.limit --variant jit=train.jit_compile=true   # one more side: the runner with XLA

Per round, each a fresh process, interleaved with the order rotated: `python -m runner` as a user types it (MLflow
on, every default; only the model, data size, batch and steps set) for each model and executor, and
benchmarks.tight_loop for each model. The runner's figure is its own steady-state throughput (the done line's
examples/s after the first call, tracing excluded, as the tight loop's); the tight loop's is the best of plain and
XLA. "ratio" is runner / tight loop, of the medians; "per round" the median of each round's own ratio. The ladder
columns say where the difference goes: `dataset` is the tight loop taking each batch from the runner's tf.data
pipeline (input), `per_step` the same at one step per call with the loss read back each time (host calls); what
lies between `dataset` and the runner is the rest of the runner's step (Keras' optimizer and metrics, per-replica
losses, callbacks and logging). A second table times each runner side's whole process, command to prompt (imports,
MLflow, tracing and evaluation included): the headline of a before / after (--against), as a user waits for it.

Models: host-bound, the default MLP 20-64-64-4, batch 256, 3000 steps; compute-bound, MLP 256-1024-1024-16,
batch 512, 150 steps.
"""

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = {
    "host-bound MLP 20-64-64-4": dict(hidden=(64, 64), features=20, classes=4, batch=256, steps=3000),
    "compute-bound MLP 256-1024-1024-16": dict(hidden=(1024, 1024), features=256, classes=16, batch=512, steps=150),
}
EXECUTORS = ("fit", "custom_loop")


def runner_argv(m, executor, strategy, cpus, steps, workers=2):
    cluster = ["cluster=localhost", f"cluster.workers={workers}", "cross_device_ops=ring"]
    return [
        sys.executable, "-m", "runner", f"executor={executor}", f"strategy={strategy}",
        *(cluster if strategy == "multi_worker_mirrored" else [f"devices.logical_cpus={cpus}"]),
        f"model.hidden_units=[{','.join(map(str, m['hidden']))}]", f"data.num_features={m['features']}",
        f"data.num_classes={m['classes']}", f"train.global_batch_size={m['batch']}", "train.epochs=1",
        f"train.steps_per_epoch={steps}", "data.eval_examples=256",
    ]  # fmt: skip


def steady_rate(out: str, batch: int, steps: int) -> float:
    """The runner's examples/s after the first call: its done line, or (an older version's) the phases line's
    train time over the steps after the first call."""
    found = re.search(r"\(([0-9,]+) examples/s after the first call\)", out)
    if found:
        return float(found.group(1).replace(",", ""))
    per_call = re.search(r"\((\d+) per tf\.function call", out)
    first = int(per_call.group(1)) if per_call else 1
    train = float(re.search(r"phases: .*?\btrain ([0-9.]+)s", out).group(1))
    return (steps - first) * batch / train


def run(argv, cwd, pythonpath=None):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=1800)
    wall = time.perf_counter() - started  # command to prompt, as the user waits for it
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc.stdout, proc.stderr, wall


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.limit")
    p.add_argument("--strategy", default="default", choices=["default", "mirrored", "multi_worker_mirrored"])
    p.add_argument("--logical-cpus", type=int, default=1)
    p.add_argument("--workers", type=int, default=2, help="multi_worker_mirrored: processes on 127.0.0.1")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one round, a tenth of the steps")
    p.add_argument("--against", help="another checkout: its runner, side by side in the same rounds")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDE[,OVERRIDE]",
                   help="one more runner side with these overrides, e.g. jit=train.jit_compile=true")  # fmt: skip
    p.add_argument("--models", default="all", choices=["all", "host", "compute"])
    p.add_argument("--scale", type=float, default=1.0, help="each model's steps times this (longer runs)")
    a = p.parse_args(argv)
    for name, value, least in (("--scale", a.scale, 0.01), ("--rounds", a.rounds, 1), ("--logical-cpus", a.logical_cpus, 1)):
        if not value >= least:
            p.error(f"{name} must be at least {least:g}; got {value:g}")
    if a.against and not os.path.isfile(os.path.join(a.against, "runner", "__main__.py")):
        p.error(f"--against {a.against}: no checkout of the runner there (no runner/__main__.py)")
    if any(not name or not overrides for name, _, overrides in (v.partition("=") for v in a.variant)):
        p.error(f"--variant takes NAME=OVERRIDE[,OVERRIDE], e.g. jit=train.jit_compile=true; got {a.variant}")
    rounds = 1 if a.quick else a.rounds
    cpus = a.logical_cpus if a.strategy == "mirrored" else 1
    models = {k: v for k, v in MODELS.items() if a.models == "all" or k.startswith(a.models)}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    versions = {"runner": (None, [])}  # name: (checkout on PYTHONPATH, overrides)
    if a.against:
        versions["before"] = (os.path.abspath(a.against), [])
    for v in a.variant:
        name, _, overrides = v.partition("=")
        versions[name] = (None, overrides.split(","))
    work = tempfile.mkdtemp(prefix="limit-")
    sides = []
    for name, m in models.items():
        steps = max(20, m["steps"] // 10) if a.quick else max(20, int(m["steps"] * a.scale))
        for executor, (version, (path, overrides)) in itertools.product(EXECUTORS, versions.items()):
            argv_ = [*runner_argv(m, executor, a.strategy, cpus, steps, a.workers), *overrides]
            argv_.append(f"mlflow.tracking_uri=sqlite:///{work}/{version}.db")
            sides.append(((name, executor, version), argv_, path, m["batch"], steps))
        tight = [sys.executable, "-m", "benchmarks.tight_loop", f"--hidden={','.join(map(str, m['hidden']))}"]
        tight += [f"--features={m['features']}", f"--classes={m['classes']}", f"--batch={m['batch']}", f"--steps={steps}"]
        tight += ["--steps-per-call=10", f"--strategy={a.strategy}", f"--logical-cpus={cpus}", f"--workers={a.workers}"]
        sides.append(((name, "tight", None), tight, None, m["batch"], steps))
    results = {key: [] for key, *_ in sides}
    walls = {key: [] for key, *_ in sides}
    count = itertools.count()
    for r in range(rounds):
        order = sides[r % len(sides) :] + sides[: r % len(sides)]
        for key, argv_, path, batch, steps in order:
            print(f"round {r + 1}/{rounds}: {key[0]}, {key[1]}{'' if key[2] in (None, 'runner') else ' (' + key[2] + ')'}",
                  file=sys.stderr, flush=True)  # fmt: skip
            cwd = path or root
            if key[1] == "tight":
                out, _, _ = run(argv_, root)
                results[key].append(json.loads(out.strip().splitlines()[-1]))
            else:
                out, err, wall = run([*argv_, f"hydra.run.dir={work}/runs/{next(count)}"], cwd, path)
                results[key].append(steady_rate(out + err, batch, steps))
                walls[key].append(wall)
    replicas = a.workers if a.strategy == "multi_worker_mirrored" else cpus
    print(f"\nstrategy {a.strategy}, {replicas} replica(s), {rounds} round(s), medians, examples/s after the first call "
          "(warm-up)\n")  # fmt: skip
    print("| model | executor | version | runner | tight loop (plain / XLA) | ratio | per round | ladder: dataset, per_step |")
    print("|---|---|---|---|---|---|---|---|")
    for name in models:
        tight = results[(name, "tight", None)]
        best = [t["tight"] for t in tight]
        plain, xla = statistics.median(t["tight_plain"] for t in tight), [t["tight_xla"] for t in tight if t.get("tight_xla")]
        ladder = f"{statistics.median(t['dataset'] for t in tight):,.0f}, {statistics.median(t['per_step'] for t in tight):,.0f}"
        for executor, version in itertools.product(EXECUTORS, versions):
            got = results[(name, executor, version)]
            ratio = statistics.median(got) / statistics.median(best)
            rounds_ratio = statistics.median(g / b for g, b in zip(got, best))
            limit = f"{statistics.median(best):,.0f} ({plain:,.0f} / {statistics.median(xla):,.0f})" if xla else f"{plain:,.0f}"
            print(f"| {name} | {executor} | {version} | {statistics.median(got):,.0f} | {limit} | {ratio:.2f} | "
                  f"{rounds_ratio:.2f} | {ladder} |")  # fmt: skip
    print(f"\nwhole process, command to prompt (MLflow on), {rounds} round(s), medians; speed: {versions_text(versions)}\n")
    print("| model | executor | " + " | ".join(f"{v} (s)" for v in versions) + " | speed vs runner, per round |")
    print("|---|---|" + "---|" * len(versions) + "---|")
    for name, executor in itertools.product(models, EXECUTORS):
        times = {v: walls[(name, executor, v)] for v in versions}
        speeds = [
            f"{v} {statistics.median(t / r for t, r in zip(times[v], times['runner'])):.2f}" for v in versions if v != "runner"
        ]
        cells = " | ".join(f"{statistics.median(t):.2f}" for t in times.values())
        print(f"| {name} | {executor} | {cells} | {', '.join(speeds) or '-'} |")


def versions_text(versions) -> str:
    """What the speed column means: each other side's time over the runner's, per round (above 1: the runner is
    faster)."""
    return "another side's time / the runner's, per round" if len(versions) > 1 else "one side only"


if __name__ == "__main__":
    main()
