"""Whole-process wall time, on the user's clock: from the command to the prompt coming back.

    python -m benchmarks.wall                  # 6 rows x 3 sides x 3 interleaved rounds, 3000 steps; ~15 min on 2 cores
    python -m benchmarks.wall --quick          # one row, 20 steps, one round, a 1-job sweep: checks that it runs
    python -m benchmarks.wall --compute-bound  # MobileNetV2 on 32x32x3 images instead of the MLP (COMPUTE_ROWS)
    python -m benchmarks.wall --only-sweep     # only the sweep row: a 4-job sweep vs its 4 jobs typed one by one
    git worktree add /tmp/before COMMIT && python -m benchmarks.wall --against /tmp/before   # before / after

Sides, each a fresh process: the runner with MLflow (its default), the runner with mlflow.enabled=false, and a
guide-style script (benchmarks/handwritten.py --save: train, then model.save; no tracking). Rounds are
interleaved with the order rotated, and medians are reported; "per round" is the median of each round's own
ratio (its runs share one of this VM's slow or fast phases). The runner's own `phases:` line breaks its time
down (imports, MLflow run creation, build, first step, training, evaluation, save, last MLflow delivery); what
is left, up to the process's exit, is `exit`. Speed ratios are times inverted: "speed, on / off" is the
MLflow-off time divided by the MLflow-on time (1.0: tracking costs nothing; above 0.95 is the target). The
per-step slope (between --slope-steps and --steps) comes from whole-process times only. --end-steps measures how
the cost after the last step grows with the run's length. The sweep row times `python -m runner -m SWEEP` against
the same jobs started one after another (MLflow on in both, one store): "speed, sweep / one by one" is the second
time divided by the first (above 0.95 is the target). --against DIR adds another version's MLflow on / off sides
and sweep, run from that checkout (on PYTHONPATH, the same environment, a store of its own), to the same rounds:
a before / after of what MLflow costs, measured side by side (benchmarks.ab compares two versions' training path,
MLflow off). Each store gets one 5-step run first: a fresh store's migrations belong
to no side.

--compute-bound: the same comparison where a step's compute, not the host, dominates: model=keras_app
(MobileNetV2, random weights, no top, average pooling, Dense logits) on seeded Gaussian 32x32x3 images with 10
random classes, written once to an .npz that both sides read (data=npz; handwritten.py --npz --model mobilenetv2),
global batch 64, 300 steps (slope from 100), rows COMPUTE_ROWS, no end-cost table. Not yet run at scale; estimated
~1 h on a quiet 2-core machine (48 + 24 processes of about 75 s and 50 s; tracing MobileNetV2's training graph over
2 replicas alone took 46-150 s per process on the loaded 2 cores here). Smoke test (3 processes, ~3.5 min loaded):
`python -m benchmarks.wall --compute-bound --quick --slope-steps 0`.
"""

import argparse
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = [
    ("default", 1, "fit"),
    ("default", 1, "custom_loop"),
    ("mirrored", 4, "fit"),
    ("mirrored", 4, "custom_loop"),
    ("central_storage", 2, "fit"),
    ("central_storage", 2, "custom_loop"),
]
COMPUTE_ROWS = [
    ("default", 1, "fit"),
    ("default", 1, "custom_loop"),
    ("mirrored", 2, "fit"),
    ("mirrored", 2, "custom_loop"),
]
MLP_DATA = ("data.num_examples=4096", "data.eval_examples=256")  # the runner's data for ROWS (synthetic, the MLP)
IMAGES = {"train": 2048, "eval": 256, "shape": (32, 32, 3), "classes": 10}
AFTER_TRAINING = ("evaluation", "save", "mlflow end", "exit")
SWEEP = {"strategy": ("default", "mirrored"), "executor": ("fit", "custom_loop")}  # 4 jobs, grid order
SWEEP_QUICK = {"executor": ("custom_loop",)}  # --quick: 1 job
SWEEP_STEPS = 200


def runner_argv(strategy, cpus, executor, steps, gbs, data=MLP_DATA):
    """`python -m runner` for one row, one epoch of `steps` steps (the benchmarks add their own outputs); `data`: the
    data and model overrides (default: the MLP on synthetic data)."""
    return [
        sys.executable, "-m", "runner", f"strategy={strategy}", f"executor={executor}", f"devices.logical_cpus={cpus}",
        f"train.global_batch_size={gbs}", "train.epochs=1", f"train.steps_per_epoch={steps}", *data, "executor.verbose=0",
    ]  # fmt: skip


def sweep_args(grid, steps):
    """The overrides of the sweep row: the grid ({key: values, or one value}) and what every job shares."""
    swept = [f"{k}={v if isinstance(v, str) else ','.join(v)}" for k, v in grid.items()]
    return [*swept, "devices.logical_cpus=2", "train.epochs=1", f"train.steps_per_epoch={steps}", "executor.verbose=0"]


def write_images(workdir) -> str:
    """The compute-bound rows' data: seeded Gaussian images and random labels, in one .npz both sides read."""
    import numpy as np

    rng = np.random.default_rng(0)
    path = os.path.join(workdir, "images.npz")
    arrays = {}
    for split in ("train", "eval"):
        arrays[f"x_{split}"] = rng.standard_normal((IMAGES[split], *IMAGES["shape"])).astype(np.float32)
        arrays[f"y_{split}"] = rng.integers(0, IMAGES["classes"], IMAGES[split]).astype(np.int32)
    np.savez(path, **arrays)
    return path


def compute_bound_sides(images):
    """(runner overrides, handwritten.py arguments) for the compute-bound rows."""
    return (
        ["data=npz", f"data.path={images}", "model=keras_app", "model.application=MobileNetV2"],
        [f"--npz={images}", "--model=mobilenetv2"],
    )


class Wall:
    def __init__(self, workdir, gbs, extra=(), data=MLP_DATA, script_extra=(), reuse=False, pythonpath=None):
        self.workdir, self.gbs, self.count, self.extra = workdir, gbs, 0, list(extra)
        self.pythonpath = pythonpath  # --against: the other checkout's runner is imported from there
        self.data, self.script_extra = data, list(script_extra)
        self.measured = {} if reuse else None  # --quick: each distinct run once (its figures are not the point)

    def _once(self, key, measure):
        if self.measured is None:
            return measure()
        if key not in self.measured:
            self.measured[key] = measure()
        return self.measured[key]

    def _time(self, argv):
        self.count += 1
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        started = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=self.workdir, env=env, timeout=1800)
        wall = time.perf_counter() - started
        if proc.returncode:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return wall, proc.stdout + proc.stderr

    def runner(self, strategy, cpus, executor, steps, mlflow=True):
        return self._once(
            ("runner", strategy, cpus, executor, steps, mlflow), lambda: self._runner(strategy, cpus, executor, steps, mlflow)
        )

    def _runner(self, strategy, cpus, executor, steps, mlflow):
        wall, out = self._time(
            [
                *runner_argv(strategy, cpus, executor, steps, self.gbs, self.data),
                f"hydra.run.dir={self.workdir}/runs/{self.count}",
                f"mlflow.tracking_uri=sqlite:///{self.workdir}/bench.db",
                "mlflow.experiment_name=wall",
                f"mlflow.enabled={str(mlflow).lower()}",
                *self.extra,
            ]
        )
        found = re.search(r"phases: (.*)", out)
        phases = {k: float(v) for k, v in re.findall(r"([a-z ]+) ([0-9.]+)s(?:,|$)", found.group(1).strip())} if found else {}
        phases = {k.strip(): v for k, v in phases.items()}
        phases["exit"] = max(0.0, wall - sum(phases.values()))
        return wall, phases

    def sweep(self, grid, steps):
        """(wall of the sweep, {"jobs": n}): `python -m runner -m` over `grid` ({key: values})."""
        wall, out = self._time(
            [
                sys.executable, "-m", "runner", "-m", *sweep_args(grid, steps), *self.extra,
                f"hydra.sweep.dir={self.workdir}/sweeps/{self.count}", f"mlflow.tracking_uri=sqlite:///{self.workdir}/bench.db",
                "mlflow.experiment_name=wall-sweep",
            ]
        )  # fmt: skip
        return wall, {"jobs": out.count("job #")}

    def one_by_one(self, grid, steps):
        """(wall of the grid's jobs typed one after another, {}): each a command of its own, in the sweep's order."""
        total = 0.0
        for values in itertools.product(*grid.values()):
            wall, _ = self._time(
                [
                    sys.executable, "-m", "runner", *sweep_args(dict(zip(grid, values)), steps), *self.extra,
                    f"hydra.run.dir={self.workdir}/runs/{self.count}",
                    f"mlflow.tracking_uri=sqlite:///{self.workdir}/bench.db", "mlflow.experiment_name=wall-sweep",
                ]
            )  # fmt: skip
            total += wall
        return total, {}

    def script(self, strategy, cpus, executor, steps):
        return self._once(("script", strategy, cpus, executor, steps), lambda: self._script(strategy, cpus, executor, steps))

    def _script(self, strategy, cpus, executor, steps):
        save = tempfile.mkdtemp(dir=self.workdir)
        wall, _ = self._time(
            [
                sys.executable,
                os.path.join(HERE, "handwritten.py"),
                f"--strategy={strategy}",
                f"--executor={executor}",
                f"--logical-cpus={cpus}",
                f"--global-batch={self.gbs}",
                f"--steps={steps}",
                f"--save={save}",
                *self.script_extra,
            ]
        )
        return wall, {}


def interleaved(sides, rounds):
    """{side: [(wall, phases), ...]}, the sides' order rotated each round."""
    names = list(sides)
    out = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            out[n].append(sides[n]())
    return out


def per_round(res, side, reference):
    """The median over rounds of `side`'s speed against `reference` within one round (reference's time / side's).
    This VM's slow and fast phases last minutes: a round's runs share one, so this moves less than the ratio of the
    medians, which compares runs from different phases."""
    return statistics.median(r / s for (s, _), (r, _) in zip(res[side], res[reference]))


def median_phases(results):
    keys = results[0][1].keys()
    return {k: statistics.median(p[k] for _, p in results if k in p) for k in keys}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.wall")
    p.add_argument("--quick", action="store_true", help="one row, one round, 20 steps (slope from 10) unless given")
    p.add_argument("--compute-bound", action="store_true", help="MobileNetV2 on 32x32x3 images (COMPUTE_ROWS)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="default 3000; 300 with --compute-bound")
    p.add_argument("--slope-steps", type=int, default=None, help="the shorter run of the per-step slope (0: no slope); "
                   "default 300; 100 with --compute-bound")  # fmt: skip
    p.add_argument("--only-end", action="store_true", help="only the cost after the last step (--end-steps)")
    p.add_argument("--only-sweep", action="store_true", help="only the sweep row (SWEEP: 4 jobs, 200 steps each)")
    p.add_argument("--runner-args", default="", help="more overrides for every runner run, space-separated")
    p.add_argument("--end-steps", default=None, help="run lengths for the cost after the last step ('': none); "
                   "default 1000,10000,100000; none with --compute-bound")  # fmt: skip
    p.add_argument("--global-batch", type=int, default=None, help="default 256; 64 with --compute-bound")
    p.add_argument("--no-script", action="store_true", help="only the runner's two sides (MLflow on / off): no script")
    p.add_argument("--no-sweep", action="store_true", help="no sweep row")
    p.add_argument("--rows", default=None, help="only these rows, by index (0,1: the default strategy's two executors)")
    p.add_argument("--against", default=None, help="another checkout of the runner (git worktree add DIR COMMIT): its "
                   "MLflow on / off sides, and its sweep, interleaved with this one's in the same rounds")  # fmt: skip
    p.add_argument("--out", default=None, help="Markdown file to write (default: docs/dev/benchmarks-wall.md, or "
                   "docs/benchmarks-wall-compute.md with --compute-bound; none with --quick)")  # fmt: skip
    args = p.parse_args(argv)
    if args.against and not os.path.isfile(os.path.join(args.against, "runner", "__init__.py")):
        p.error(f"--against {args.against}: no runner/ package there (a checkout: git worktree add DIR COMMIT)")
    rows = COMPUTE_ROWS if args.compute_bound else ROWS
    if args.compute_bound:
        defaults = (20, 10, "", 64) if args.quick else (300, 100, "", 64)
    else:
        defaults = (20, 10, "20", 256) if args.quick else (3000, 300, "1000,10000,100000", 256)
    for name, value in zip(("steps", "slope_steps", "end_steps", "global_batch"), defaults):
        if getattr(args, name) is None:  # given on the command line: kept, --quick included
            setattr(args, name, value)
    if args.quick:
        rows, args.rounds = rows[1:2], 1
    if args.rows is not None:
        rows = [rows[int(i)] for i in args.rows.split(",")]
    workdir = tempfile.mkdtemp(prefix="runner-wall-")
    data, script_extra = compute_bound_sides(write_images(workdir)) if args.compute_bound else (MLP_DATA, ())
    w = Wall(workdir, args.global_batch, args.runner_args.split(), data, script_extra, reuse=args.quick)
    other = None
    if args.against:
        os.makedirs(os.path.join(workdir, "against"))
        other = Wall(os.path.join(workdir, "against"), args.global_batch, args.runner_args.split(), data, pythonpath=args.against)
    if not args.quick:  # a fresh store's migrations belong to no side: one short run into each store first
        for wall in (w, other) if other else (w,):
            wall.runner(*rows[0], 5)
    lines = []

    def say(text):
        lines.append(text)
        print(text, flush=True)

    if args.compute_bound:
        say(
            f"Compute-bound rows: {' '.join(data[2:])} (random weights) on {IMAGES['train']} seeded Gaussian "
            f"{'x'.join(map(str, IMAGES['shape']))} images, {IMAGES['classes']} classes (data=npz); the script: "
            "benchmarks/handwritten.py --model=mobilenetv2 on the same file."
        )
        say("")
    if args.runner_args:
        say(f"Every runner run with: {args.runner_args}")
        say("")
    if other:
        say(f"Against: the runner in {args.against} (a store of its own), its sides interleaved with this one's.")
        say("")
    main_rows = [] if args.only_end or args.only_sweep else rows
    if main_rows:
        say(
            f"whole-process wall time, {args.steps} steps x global batch {args.global_batch}, {args.rounds} interleaved "
            "round(s), medians"
        )
        say("")
        against = " against: on / off (s) | against: speed, on / off | against: per round |" if other else ""
        say(
            "| strategy | executor | runner, MLflow on (s) | MLflow off (s) | script (s) | speed, on / off | "
            "on / off, per round | speed, runner / script | after the last step (s) | runner phases, MLflow on (s) | "
            f"MLflow off (s) |{against}"
        )
        say("|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * (3 if other else 0))
    for strategy, cpus, executor in main_rows:
        sides = {
            "on": lambda: w.runner(strategy, cpus, executor, args.steps),
            "off": lambda: w.runner(strategy, cpus, executor, args.steps, mlflow=False),
            "script": lambda: w.script(strategy, cpus, executor, args.steps),
        }
        if args.no_script:
            del sides["script"]
        if other:
            sides["against on"] = lambda: other.runner(strategy, cpus, executor, args.steps)
            sides["against off"] = lambda: other.runner(strategy, cpus, executor, args.steps, mlflow=False)
        res = interleaved(sides, args.rounds)
        on, off, script = (statistics.median(t for t, _ in res[k]) if k in res else float("nan") for k in ("on", "off", "script"))
        phases = median_phases(res["on"])
        after = sum(phases.get(k, 0.0) for k in AFTER_TRAINING)
        breakdown = ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
        off_breakdown = ", ".join(f"{k} {v:.2f}" for k, v in median_phases(res["off"]).items())
        against = ""
        if other:
            a_on, a_off = (statistics.median(t for t, _ in res[k]) for k in ("against on", "against off"))
            against = f" {a_on:.2f} / {a_off:.2f} | {a_off / a_on:.3f} | {per_round(res, 'against on', 'against off'):.3f} |"
        say(
            f"| {strategy} ({cpus}) | {executor} | {on:.2f} | {off:.2f} | {script:.2f} | {off / on:.3f} | "
            f"{per_round(res, 'on', 'off'):.3f} | {script / on:.3f} | {after:.2f} | {breakdown} | {off_breakdown} |{against}"
        )
    if not args.only_end and not args.compute_bound and not args.no_sweep:
        grid, steps = (SWEEP_QUICK, args.steps) if args.quick else (SWEEP, SWEEP_STEPS)
        sides = {"sweep": lambda: w.sweep(grid, steps), "one by one": lambda: w.one_by_one(grid, steps)}
        if other:
            sides["against sweep"] = lambda: other.sweep(grid, steps)
            sides["against one by one"] = lambda: other.one_by_one(grid, steps)
        res = interleaved(sides, args.rounds)
        sweep, single = (statistics.median(t for t, _ in res[k]) for k in ("sweep", "one by one"))
        jobs = len(list(itertools.product(*grid.values())))
        assert all(p["jobs"] >= jobs for _, p in res["sweep"]), "the sweep did not run every job"
        say("")
        say(
            f"A sweep against its jobs one by one, whole process, MLflow on, {args.rounds} interleaved round(s), medians: "
            f"`python -m runner -m {' '.join(sweep_args(grid, steps))}`"
        )
        say("")
        say("| jobs | sweep (s) | one by one (s) | speed, sweep / one by one | per round |")
        say("|---|---|---|---|---|")
        say(f"| {jobs} | {sweep:.2f} | {single:.2f} | {single / sweep:.3f} | {per_round(res, 'sweep', 'one by one'):.3f} |")
        if other:
            a_sweep, a_single = (statistics.median(t for t, _ in res[k]) for k in ("against sweep", "against one by one"))
            per = per_round(res, "against sweep", "against one by one")
            say(f"| {jobs}, against | {a_sweep:.2f} | {a_single:.2f} | {a_single / a_sweep:.3f} | {per:.3f} |")
    if args.slope_steps and main_rows:
        say("")
        say(f"Per-step slope from whole-process times, ({args.steps} - {args.slope_steps} steps), medians:")
        say("")
        say("| strategy | executor | runner ms/step | script ms/step | speed, runner / script |")
        say("|---|---|---|---|---|")
        for strategy, cpus, executor in dict.fromkeys([rows[0], rows[-1]]):  # one row with --quick, not twice
            res = interleaved(
                {
                    "runner long": lambda: w.runner(strategy, cpus, executor, args.steps),
                    "runner short": lambda: w.runner(strategy, cpus, executor, args.slope_steps),
                    "script long": lambda: w.script(strategy, cpus, executor, args.steps),
                    "script short": lambda: w.script(strategy, cpus, executor, args.slope_steps),
                },
                args.rounds,
            )
            med = {k: statistics.median(t for t, _ in v) for k, v in res.items()}
            span = args.steps - args.slope_steps
            r = 1000 * (med["runner long"] - med["runner short"]) / span
            s = 1000 * (med["script long"] - med["script short"]) / span
            say(f"| {strategy} ({cpus}) | {executor} | {r:.3f} | {s:.3f} | {s / r:.3f} |")
    if args.end_steps and not args.only_sweep:
        say("")
        say(
            "Cost after the last training step (evaluation, save, last MLflow delivery, exit), MLflow on, "
            f"{rows[-1][0]} {rows[-1][2]}, one run each:"
        )
        say("")
        say("| steps | after the last step (s) | of which MLflow's last delivery (s) |")
        say("|---|---|---|")
        strategy, cpus, executor = rows[-1]
        for steps in [int(s) for s in args.end_steps.split(",")]:
            _, phases = w.runner(strategy, cpus, executor, steps)
            say(f"| {steps} | {sum(phases.get(k, 0.0) for k in AFTER_TRAINING):.2f} | {phases.get('mlflow end', 0.0):.2f} |")
    name = "benchmarks-wall-compute.md" if args.compute_bound else "benchmarks-wall.md"
    partial = args.quick or args.only_sweep or args.only_end  # not the whole page: printed, written only with --out
    out = args.out or (None if partial else os.path.join(HERE, "..", "docs", "dev", name))
    if out:
        from benchmarks.run import machine

        with open(out, "w") as f:
            f.write(
                "# Whole-process benchmarks (`python -m benchmarks.wall`)\n\n"
                + f"Machine: {machine()}.\n\n"
                + "\n".join(lines)
                + "\n"
            )
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
