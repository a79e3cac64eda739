"""The sweep's comparison report, from the child runs in MLflow: a table (terminal, CSV, Markdown) and
plots (throughput per job, loss curves, scaling efficiency), saved in the sweep directory and logged as
artifacts of the parent run. A job that left no run (refused before its first step, its run deleted; or failed
before a run existed) has a row from the sweep's own record of it, status REFUSED (exit 2) or FAILED."""

import csv
import glob
import json
import os

COLUMNS = [
    "job",
    "run",
    "status",
    "strategy",
    "executor",
    "replicas",
    "examples_per_sec",
    "examples_per_sec_per_replica",
    "final_loss",
    "eval_loss",
    "eval_accuracy",
]


SHARED = ("strategy", "executor", "replicas")  # dropped from the shown table when every job has the same value
NOT_SWEPT = ("strategy", "executor", "experiment", "hydra.")  # columns of their own, or not a searched value


REFUSED = "REFUSED"  # a job refused before its first step (exit 2): it trained nothing and left no run


def _given(overrides) -> dict[str, str]:
    return dict(o.lstrip("+~").split("=", 1) for o in overrides if "=" in o)


def _overrides(run) -> dict[str, str]:
    return _given(run.data.tags.get("overrides", "").split())


def swept_keys(given: list[dict[str, str]]) -> list[str]:
    """The override keys whose value differs between jobs (what a grid or a sampler searched), in first-seen order."""
    keys = dict.fromkeys(k for o in given for k in o if not k.startswith(NOT_SWEPT))
    return [k for k in keys if len({o.get(k, "") for o in given}) > 1]


def shown_columns(rows: list[dict], swept: list[str]) -> tuple[list[str], dict[str, str]]:
    """The table's columns: the searched keys after `status`, without the columns every job shares (returned
    apart, to be said once)."""
    same = {c: _fmt(rows[0][c]) for c in SHARED if len(rows) > 1 and len({_fmt(r[c]) for r in rows}) == 1}
    columns = [c for c in COLUMNS if c not in same]
    at = columns.index("status") + 1
    return columns[:at] + swept + columns[at:], same


def _row(run, swept=()) -> dict:
    m, p, t = run.data.metrics, run.data.params, run.data.tags
    given = _overrides(run)
    return {
        **{k: given.get(k, "") for k in swept},
        "job": int(t.get("sweep.job_num", -1)),
        "run": run.info.run_name,
        "status": f"PRUNED at {t['sweep.pruned_at_step']}" if "sweep.pruned_at_step" in t else run.info.status,
        "strategy": p.get("strategy.name", ""),
        "executor": p.get("executor.name", ""),
        "replicas": int(t["num_replicas_in_sync"]) if "num_replicas_in_sync" in t else "",
        "examples_per_sec": m.get("summary/examples_per_sec", ""),
        "examples_per_sec_per_replica": m.get("summary/examples_per_sec_per_replica", ""),
        "final_loss": m.get("loss", ""),
        "eval_loss": m.get("eval/loss", ""),
        "eval_accuracy": m.get("eval/accuracy", ""),
    }


def _job_row(record: dict, swept=()) -> dict:
    """The row of a job that left no run, from its record (runner.sweeps.sweep.run_sweep_job): what its overrides say."""
    given = _given(record["overrides"])
    row = {c: "" for c in COLUMNS}
    return {
        **row,
        **{k: given.get(k, "") for k in swept},
        "job": record["num"],
        "status": "SKIPPED" if record.get("skipped") else REFUSED if record["returncode"] == 2 else "FAILED",
        "strategy": given.get("strategy", ""),
        "executor": given.get("executor", ""),
    }


def _why(record: dict) -> str:
    """'; <its error line>' of a failed job's record: the paragraph it ended with, which many lines of other jobs
    may have pushed far above the sweep's last line ('' when its output held none)."""
    said = [line.strip() for line in (record.get("error") or "").splitlines() if line.strip()]
    errors = [line for line in said if line.startswith(("Error", "Stopped"))]
    line = (errors or said or [""])[-1]
    return f"; it said: {line[:300]}{'...' if len(line) > 300 else ''}" if line else ""


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4f}"
    if isinstance(value, str) and value[:1].isdigit() and "." in value:  # a searched float: 0.03028525153605885
        try:
            return f"{float(value):.4g}"
        except ValueError:
            pass
    return str(value)


def _same_line(same: dict[str, str]) -> str:
    return "every job: " + ", ".join(f"{k}={v}" for k, v in same.items()) if same else ""


def table_text(rows: list[dict], swept=()) -> str:
    columns, same = shown_columns(rows, list(swept)) if rows else (COLUMNS, {})
    cells = [columns] + [[_fmt(r[c]) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)
    return text + ("\n" + _same_line(same) if same else "")


def markdown(rows: list[dict], swept=()) -> str:
    columns, same = shown_columns(rows, list(swept)) if rows else (COLUMNS, {})
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n" + ("\n" + _same_line(same) + "\n" if same else "")


def scaling_efficiency(rows: list[dict]) -> dict[int, float]:
    """Per job with more than one replica: (its examples/sec / the one-replica baseline's) / replicas.
    The baseline is the fastest one-replica job of the same executor."""
    out = {}
    for r in rows:
        if not isinstance(r["replicas"], int) or r["replicas"] < 2 or not r["examples_per_sec"]:
            continue
        base = [
            b["examples_per_sec"] for b in rows if b["replicas"] == 1 and b["executor"] == r["executor"] and b["examples_per_sec"]
        ]
        if base:
            out[r["job"]] = r["examples_per_sec"] / max(base) / r["replicas"]
    return out


def interval_means(points: list[tuple[int, float]], steps_per_epoch: int | None) -> list[tuple[int, float]]:
    """The logged training loss is the mean since its epoch began (as Model.fit logs it), so a curve of it restarts
    at every epoch boundary: (step, the mean over the steps since the previous logged point) instead. Without
    steps_per_epoch (a run logged before it was tagged) the points are given back as they are."""
    if not steps_per_epoch:
        return points
    out, last_epoch, last_n, last_mean = [], None, 0, 0.0
    for step, mean in points:
        epoch, n = (step - 1) // steps_per_epoch, (step - 1) % steps_per_epoch + 1  # n: steps of its epoch so far
        if epoch != last_epoch:
            last_n, last_mean = 0, 0.0
        if n > last_n:
            out.append((step, (mean * n - last_mean * last_n) / (n - last_n)))
        last_epoch, last_n, last_mean = epoch, n, mean
    return out


def _steps_per_epoch(run) -> int | None:
    value = run.data.tags.get("steps_per_epoch") or run.data.params.get("train.steps_per_epoch")
    return int(value) if value and str(value).isdigit() else None


def plots(client, runs, rows, out_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    label = {r["job"]: f"{r['job']}: {r['strategy']}/{r['executor']}" for r in rows}
    done = [r for r in rows if r["examples_per_sec"]]
    if done:
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.barh([label[r["job"]] for r in done], [r["examples_per_sec"] for r in done])
        ax.set_xlabel("examples/sec (after warm-up)")
        ax.set_title("Throughput per job")
        fig.tight_layout()
        files.append(os.path.join(out_dir, "throughput.png"))
        fig.savefig(files[-1])
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    for run, r in zip(runs, rows):
        history = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
        points = interval_means([(m.step, m.value) for m in history], _steps_per_epoch(run))
        if points:
            ax.plot([s for s, _ in points], [v for _, v in points], label=label[r["job"]])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss, mean over each logging interval")
    ax.set_title("Loss curves")
    if ax.lines:
        ax.legend(fontsize="small")
    fig.tight_layout()
    files.append(os.path.join(out_dir, "loss_curves.png"))
    fig.savefig(files[-1])
    plt.close(fig)
    efficiency = scaling_efficiency(rows)
    if efficiency:
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.barh([label[j] for j in efficiency], list(efficiency.values()))
        ax.axvline(1.0, color="gray", linestyle="--")
        ax.set_xlabel("scaling efficiency vs the one-replica baseline (1.0 = linear)")
        fig.tight_layout()
        files.append(os.path.join(out_dir, "scaling_efficiency.png"))
        fig.savefig(files[-1])
        plt.close(fig)
    return files


def ranked(runs, rows, objective: str, direction: str):
    """The jobs best first by their final `objective` (jobs without it last, in job order)."""
    sign = -1.0 if direction == "maximize" else 1.0

    def key(pair):
        value = pair[0].data.metrics.get(objective)
        return (value is None, sign * value if value is not None else 0.0, pair[1]["job"])

    pairs = sorted(zip(runs, rows), key=key)
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _tag_best(client, parent_id: str, runs, objective: str) -> None:
    best = runs[0] if runs and objective in runs[0].data.metrics else None
    if best is None:
        return
    value = best.data.metrics[objective]
    for name, tag in (("sweep.objective", objective), ("sweep.best_value", str(value)), ("sweep.best_run_id", best.info.run_id)):
        client.set_tag(parent_id, name, tag)
    client.set_tag(parent_id, "sweep.best_job", best.data.tags.get("sweep.job_num", ""))
    client.set_tag(best.info.run_id, "sweep.best", "true")
    print(f"best: job #{best.data.tags.get('sweep.job_num', '?')} ({best.info.run_name}), {objective}={value:.6g}")


def _tag_fastest(client, parent_id: str, runs) -> None:
    """The finished job of the highest summary/examples_per_sec: what a strategy sweep asks."""
    timed = [r for r in runs if r.info.status == "FINISHED" and "summary/examples_per_sec" in r.data.metrics]
    if len(timed) < 2:
        return
    fastest = max(timed, key=lambda r: r.data.metrics["summary/examples_per_sec"])
    speed = fastest.data.metrics["summary/examples_per_sec"]
    for name, tag in (("sweep.fastest_run_id", fastest.info.run_id), ("sweep.fastest_examples_per_sec", f"{speed:.6g}")):
        client.set_tag(parent_id, name, tag)
    client.set_tag(parent_id, "sweep.fastest_job", fastest.data.tags.get("sweep.job_num", ""))
    how = {(r.data.params.get("strategy.name"), r.data.params.get("executor.name"), r.data.tags.get("num_replicas_in_sync"))
           for r in timed}  # fmt: skip
    if len(how) > 1:  # said where the jobs differ in how they train (a strategy sweep), not between seeds
        print(f"fastest: job #{fastest.data.tags.get('sweep.job_num', '?')} ({fastest.info.run_name}), {speed:,.0f} examples/s")


def write_report(
    uri: str, parent_id: str, sweep_dir: str, objective: str | None = None, direction: str | None = None
) -> list[str]:
    """Write the report, log it to the parent run, end the parent run. Returns the failed jobs' labels. With an
    objective (a sampling sweeper's), the rows are best first and the parent run is tagged with the best job."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    parent = client.get_run(parent_id)
    runs = client.search_runs(  # active runs: a refused job's run was deleted
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'", max_results=10000
    )
    results = []
    for path in glob.glob(os.path.join(sweep_dir, ".runner", "job-*.json")):
        with open(path) as f:
            results.append(json.load(f))
    with_runs = {r.data.tags.get("sweep.job_num") for r in runs}
    runless = sorted(
        (s for s in results if (s["returncode"] or s.get("skipped")) and str(s["num"]) not in with_runs), key=lambda s: s["num"]
    )
    swept = swept_keys([_overrides(r) for r in runs] + [_given(s["overrides"]) for s in runless])
    pairs = sorted(zip(runs, [_row(r, swept) for r in runs]), key=lambda p: p[1]["job"])
    runs, rows = [p[0] for p in pairs], [p[1] for p in pairs]
    if objective:
        runs, rows = ranked(runs, rows, objective, direction or "minimize")
        _tag_best(client, parent_id, runs, objective)
    _tag_fastest(client, parent_id, runs)
    plotted = rows
    extra = [_job_row(s, swept) for s in runless]  # ranked: after the jobs with an objective (they have none)
    rows = rows + extra if objective else sorted(rows + extra, key=lambda r: r["job"])
    ended = sorted(results, key=lambda s: s["num"])
    failed = [f"#{s['num']} ({' '.join(s['overrides'])}{_why(s)})" for s in ended if s["returncode"]]
    failed += [
        f"#{r['job']} ({r['run']})"
        for r in rows  # in job order
        if r["status"] != "FINISHED"
        and not str(r["status"]).startswith("PRUNED")  # ended cleanly where the search stopped it
        and r["status"] != "SKIPPED"  # not started: sweep.on_failure=stop after another job failed
        and not any(s["num"] == r["job"] and s["returncode"] for s in results)
    ]
    with open(os.path.join(sweep_dir, "report.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS + swept)  # every column, the shared ones too: for scripts
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(sweep_dir, "report.md"), "w") as f:
        f.write(markdown(rows, swept))
    files = [os.path.join(sweep_dir, "report.csv"), os.path.join(sweep_dir, "report.md")]
    files += plots(client, runs, plotted, sweep_dir)
    files += sorted(glob.glob(os.path.join(sweep_dir, "optuna_*.png")))  # the search's own (runner.sweeps.search)
    files += [p for p in [os.path.join(sweep_dir, "importances.json")] if os.path.exists(p)]
    for path in files:
        client.log_artifact(parent_id, path, "report")
    print("\n" + table_text(rows, swept) + "\n")
    print(f"report: {sweep_dir}/report.md, report.csv and plots; MLflow parent run {parent.info.run_name} ({parent_id})")
    client.set_tag(parent_id, "sweep.failed_jobs", str(len(failed)))
    client.set_terminated(parent_id, "FAILED" if failed else "FINISHED")
    return failed
