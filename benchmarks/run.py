"""The runner against hand-written tf.distribute code, and where the time goes.

    python -m benchmarks.run            # full: several interleaved rounds (A B A B), medians; ~30 min on 2 cores
    python -m benchmarks.run --quick    # tiny sizes, one round: checks that everything runs
    python -m benchmarks.run --sections hand --strategies mirrored,central_storage --rounds 11   # rerun some rows

Writes a Markdown table (docs/dev/benchmarks.md by default, machine description included) and logs the
figures to MLflow (experiment "benchmarks"). Each measurement is a fresh process, as real runs are.
Throughput is examples / training time: from the training call (Model.fit, or the custom loop with its
iterator) to the end of its last step, first step and tracing included, measured the same way on both sides.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STRATEGIES = [("default", 1), ("mirrored", 4), ("central_storage", 4)]
SECTIONS = ["hand", "pinned", "logging", "steps", "pipeline", "startup"]


class Bench:
    def __init__(self, steps, gbs, rounds, workdir):
        self.steps, self.gbs, self.rounds, self.workdir = steps, gbs, rounds, workdir
        self.count = 0

    pinned = False  # True: children run on CPU 0 only (one core: no thread lands on another core)

    def _run(self, argv):
        pin = (lambda: os.sched_setaffinity(0, {0})) if self.pinned else None
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            cwd=self.workdir,
            timeout=900,
            preexec_fn=pin,
            env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"},
        )
        if proc.returncode:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return proc.stdout, proc.stderr

    def handwritten(self, strategy, cpus, executor, per_call=1):
        out = self._run(
            [
                sys.executable,
                os.path.join(HERE, "handwritten.py"),
                f"--strategy={strategy}",
                f"--executor={executor}",
                f"--logical-cpus={cpus}",
                f"--global-batch={self.gbs}",
                f"--steps={self.steps}",
                f"--steps-per-call={per_call}",
            ]
        )
        return json.loads(out[0].strip().splitlines()[-1])["examples_per_sec"]

    def runner(self, strategy, cpus, executor, *extra):
        self.count += 1
        out = self._run(
            [
                sys.executable,
                "-m",
                "runner",
                f"strategy={strategy}",
                f"executor={executor}",
                f"devices.logical_cpus={cpus}",
                f"train.global_batch_size={self.gbs}",
                "train.epochs=1",
                f"train.steps_per_epoch={self.steps}",
                "data.num_examples=4096",
                "data.eval_examples=256",
                "data.shuffle_buffer=4096",
                "save_model=false",
                "checkpoint.enabled=false",
                "executor.verbose=0",
                f"hydra.run.dir={self.workdir}/runs/{self.count}",
                f"mlflow.tracking_uri=sqlite:///{self.workdir}/bench.db",
                "mlflow.experiment_name=bench-runs",
                *extra,
            ]
        )
        out = out[0] + out[1]
        train_sec = float(re.search(r"training ([0-9.]+)s", out).group(1))
        first = re.search(r"first step after ([0-9.]+)s", out)
        return self.steps * self.gbs / train_sec, float(first.group(1)) if first else None

    def rounds_of(self, a, b):
        """Interleaved A B A B ...: every round's figure of each side."""
        xs, ys = [], []
        for _ in range(self.rounds):
            xs.append(a())
            ys.append(b())
        return xs, ys

    def compare(self, a, b):
        """Interleaved rounds of a and b: (median a, median b, median b / median a, best b / best a)."""
        xs, ys = self.rounds_of(a, b)
        mx, my = statistics.median(xs), statistics.median(ys)
        return mx, my, my / mx, max(ys) / max(xs)

    def pair(self, a, b):
        """Interleaved A B A B ...: medians of each side."""
        xs, ys = self.rounds_of(a, b)
        return statistics.median(xs), statistics.median(ys)


def wall(argv, rounds, cwd):
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, cwd=cwd, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    import importlib.metadata as md

    return (
        f"{platform.platform()}; {os.cpu_count()} cores ({model}); Python {platform.python_version()}; "
        f"tensorflow {md.version('tensorflow')}, tf_keras {md.version('tf_keras')}, mlflow {md.version('mlflow')}; "
        "no GPU"
    )


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.run")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--out", default=None, help="default: docs/dev/benchmarks.md for a full run, else ./benchmarks-partial.md")
    p.add_argument("--tracking-uri", default=None, help="where to log the figures (default: ./mlflow.db)")
    p.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)}: rerun only these, e.g. with more --rounds",
    )
    p.add_argument(
        "--strategies",
        default=None,
        help=f"rows of the hand-written comparison (default: {','.join(s for s, _ in STRATEGIES)}; --quick: the first)",
    )
    args = p.parse_args(argv)
    sections = args.sections.split(",")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        p.error(f"--sections: unknown {unknown}; choose from {','.join(SECTIONS)}")
    quick_default = STRATEGIES[0][0] if args.quick else ",".join(s for s, _ in STRATEGIES)
    chosen = (args.strategies or quick_default).split(",")
    if set(chosen) - {s for s, _ in STRATEGIES}:
        p.error(f"--strategies: choose from {','.join(s for s, _ in STRATEGIES)}")
    if args.quick:
        args.rounds, args.steps = 1, 20
    workdir = tempfile.mkdtemp(prefix="runner-bench-")
    b = Bench(args.steps, args.global_batch, args.rounds, workdir)
    strategies = [(s, n) for s, n in STRATEGIES if s in chosen]
    full = sections == SECTIONS and len(chosen) == len(STRATEGIES)
    args.out = args.out or (os.path.join(HERE, "..", "docs", "dev", "benchmarks.md") if full else "benchmarks-partial.md")
    figures, lines = {}, []
    say = lambda text: print(text, flush=True)  # noqa: E731

    def add_row(label, first, second, key):
        """A table row from interleaved rounds of first and second: medians, their ratio, best / best."""
        x, y, ratio, best = b.compare(first, second)
        figures[key], figures[key.replace("/", "_best/", 1)] = ratio, best
        lines.append(f"| {label} | {x:,.0f} | {y:,.0f} | {ratio:.3f} | {best:.3f} |")
        say(lines[-1])

    say(f"benchmarks: {args.steps} steps x global batch {args.global_batch}, {args.rounds} round(s), interleaved")
    if "hand" in sections:
        lines += [
            "## Runner vs hand-written tf.distribute (examples/sec)",
            "",
            "Medians of the interleaved rounds, and the best round of each side (see the notes below for why both).",
            "",
            "| strategy | executor | hand-written (median) | runner (median) | runner / hand-written, medians | best / best |",
            "|---|---|---|---|---|---|",
        ]
        for strategy, cpus in strategies:
            for executor in ["fit", "custom_loop"]:
                add_row(
                    f"{strategy} ({cpus} CPU) | {executor}",
                    lambda: b.handwritten(strategy, cpus, executor),
                    lambda: b.runner(strategy, cpus, executor)[0],
                    f"ratio/{strategy}/{executor}",
                )

    if "pinned" in sections and hasattr(os, "sched_setaffinity") and not args.quick:
        lines += [
            "",
            "## The same, default strategy, pinned to one core",
            "",
            "Every thread of both sides on CPU 0: slower, but the same conditions for each side, run after run.",
            "",
            "| strategy | executor | hand-written (median) | runner (median) | runner / hand-written, medians | best / best |",
            "|---|---|---|---|---|---|",
        ]
        b.pinned = True
        for executor in ["fit", "custom_loop"]:
            add_row(
                f"default (CPU 0 only) | {executor}",
                lambda: b.handwritten("default", 1, executor),
                lambda: b.runner("default", 1, executor)[0],
                f"ratio_pinned/default/{executor}",
            )
        b.pinned = False

    if "logging" in sections:
        lines += [
            "",
            "## MLflow logging on vs off (runner, default strategy, fit)",
            "",
            "| log_every_n_steps | off (median) | on (median) | on / off, medians | best / best |",
            "|---|---|---|---|---|",
        ]
        for every in [10] if args.quick else [10, 1]:
            add_row(
                every,
                lambda: b.runner("default", 1, "fit", "mlflow.enabled=false", f"train.log_every_n_steps={every}")[0],
                lambda: b.runner("default", 1, "fit", f"train.log_every_n_steps={every}")[0],
                f"logging/every_{every}",
            )

    if "steps" in sections:
        lines += [
            "",
            "## Steps per tf.function call (runner, default strategy)",
            "",
            "| N | fit, steps_per_execution=N (median) | custom_loop, steps_per_loop=N (median) | custom / fit, medians "
            "| best / best |",
            "|---|---|---|---|---|",
        ]
        for n in [10] if args.quick else [1, 10, 100]:
            add_row(
                n,
                lambda: b.runner("default", 1, "fit", f"train.steps_per_execution={n}")[0],
                lambda: b.runner("default", 1, "custom_loop", f"train.steps_per_loop={n}")[0],
                f"steps_per_call/{n}/custom_over_fit",
            )

    if "pipeline" in sections:
        lines += [
            "",
            "## Input pipeline (runner, default strategy, custom_loop, steps_per_loop=10)",
            "",
            "| prefetch + cache off | on | on / off |",
            "|---|---|---|",
        ]
        off, on = b.pair(
            lambda: b.runner("default", 1, "custom_loop", "train.steps_per_loop=10", "data.prefetch=false", "data.cache=false")[
                0
            ],
            lambda: b.runner("default", 1, "custom_loop", "train.steps_per_loop=10", "data.prefetch=true", "data.cache=true")[0],
        )
        figures["pipeline/on_over_off"] = on / off
        lines.append(f"| {off:,.0f} | {on:,.0f} | {on / off:.3f} |")
        say(lines[-1])

    if "startup" in sections:
        starts = 1 if args.quick else max(3, args.rounds)
        cfg_job = wall([sys.executable, "-m", "runner", "--cfg", "job"], starts, workdir)
        help_ = wall([sys.executable, "-m", "runner", "--help"], starts, workdir)
        firsts = [b.runner("default", 1, "fit")[1] for _ in range(args.rounds)]
        first = statistics.median(firsts)
        figures.update({"wall/cfg_job_sec": cfg_job, "wall/help_sec": help_, "wall/to_first_step_sec": first})
        lines += [
            "",
            "## Start-up (median wall time)",
            "",
            "| command | seconds |",
            "|---|---|",
            f"| `python -m runner --cfg job` | {cfg_job:.2f} |",
            f"| `python -m runner --help` | {help_:.2f} |",
            f"| `python -m runner` (default experiment): process start to end of first training step | {first:.2f} |",
        ]
        say("\n".join(lines[-3:]))

    header = [
        "# Benchmarks",
        "",
        f"Machine: {machine()}.",
        "",
        f"`python -m benchmarks.run{' --quick' if args.quick else ''}`: {args.steps} steps, global batch "
        f"{args.global_batch}, MLP 20-64-64-4 on synthetic data, {args.rounds} interleaved round(s), medians and best rounds. "
        "Throughput = examples / training time, measured the same way on both sides: from the training call to "
        "the end of its last step (Model.fit: its on_train_end), first step and tracing included; the input "
        "iterator's teardown after that is not (see the notes below).",
        "",
        "These tables time the training call. What a user waits for, from the command to the prompt (imports, "
        "MLflow, evaluation, saving, exit included), is in [benchmarks-wall.md](benchmarks-wall.md) "
        "(`python -m benchmarks.wall`).",
        "",
    ]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    notes_path = os.path.join(HERE, "NOTES.md")
    notes = open(notes_path).read() if os.path.exists(notes_path) and not args.quick and full else ""
    with open(args.out, "w") as f:
        f.write("\n".join(header + lines) + "\n\n" + notes)
    _log(figures, args)
    say(f"wrote {args.out}")


def _log(figures, args):
    import mlflow

    if args.tracking_uri:
        mlflow.set_tracking_uri(args.tracking_uri)
    mlflow.set_experiment("benchmarks")
    with mlflow.start_run(run_name="quick" if args.quick else "full" if args.sections == ",".join(SECTIONS) else "partial"):
        mlflow.log_params(
            {
                "steps": args.steps,
                "global_batch": args.global_batch,
                "rounds": args.rounds,
                "machine": machine()[:500],
                "sections": args.sections,
                "strategies": args.strategies,
            }
        )
        mlflow.log_metrics(figures)
        mlflow.log_artifact(args.out)


if __name__ == "__main__":
    main()
