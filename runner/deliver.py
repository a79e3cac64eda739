"""python -m runner.deliver OUTPUT_DIR [--tracking-uri URI]: send what a run could not deliver to MLflow.

The tracking URI is --tracking-uri, else $MLFLOW_TRACKING_URI, else the run's own (from its .hydra config: its
mlflow.tracking_uri, else MLflow's default sqlite:///mlflow.db in the directory the run was started from).

Deliveries of one outbox take turns (a lock on the file): two started together send each value once. Lines that are
not whole records are set aside in mlflow_outbox.jsonl.damaged; records of a run the store lacks stay in the outbox.
Exit 0 when everything was sent (or nothing was left), 2 when something could not be (each case is said).
"""

import argparse
import os
import sys

from runner.config import layout
from runner.config.redact import redact, redact_uri
from runner.mlflow_process import delivery
from runner.tracking import outbox


def _hydra_file(directory: str, name: str) -> dict:
    """A .hydra/<name> of the run, as plain YAML ({} when it is missing or unreadable: it only helps find the store)."""
    import yaml

    try:
        with open(os.path.join(directory, ".hydra", name)) as f:
            data = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _get(data: dict, *keys):
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _run_uri(directory: str):
    """The store the run logged to, as far as its directory tells: its mlflow.tracking_uri, else the default
    sqlite:///mlflow.db, a relative SQLite path taken from where the run was started (hydra.runtime.cwd)."""
    uri = _get(_hydra_file(directory, "config.yaml"), "mlflow", "tracking_uri")
    uri = uri if isinstance(uri, str) and uri and "${" not in uri else None
    cwd = _get(_hydra_file(directory, "hydra.yaml"), "hydra", "runtime", "cwd")
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        return uri
    uri = uri or "sqlite:///mlflow.db"
    path = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else None
    if path and path != ":memory:" and not os.path.isabs(path):
        uri = "sqlite:///" + os.path.join(cwd, path)
    return uri


RUN_MARKERS = (layout.HYDRA_DIR + "/", layout.RUN_ID_FILE, layout.OUTBOX_FILE)  # every output directory holds one


def not_a_run_dir(directory: str):
    """Why `directory` is not a run's output directory (one line, saying what to pass instead), or None."""
    instead = "pass the run's output directory, e.g. outputs/<date>/<time> (a sweep job: multirun/<date>/<time>/<job>)"
    if not os.path.isdir(directory):
        return f"{directory} {'is not a directory' if os.path.exists(directory) else 'does not exist'}: {instead}."
    if any(os.path.exists(os.path.join(directory, marker.rstrip("/"))) for marker in RUN_MARKERS):
        return None
    if os.path.isfile(os.path.join(directory, "multirun.yaml")):
        jobs = sorted(
            (name for name in os.listdir(directory) if outbox.exists(os.path.join(directory, name))),
            key=lambda name: (len(name), name),
        )
        pending = ", ".join(os.path.join(directory, name) for name in jobs) if jobs else "none of its jobs has one"
        return f"{directory} is a sweep directory: pass one of its job directories (with {outbox.FILE}: {pending})."
    return f"{directory} is not a runner output directory (it has none of {', '.join(RUN_MARKERS)}): {instead}."


def outbox_problem(directory: str):
    """Why the outbox path of `directory` is there but cannot be an outbox (a directory, a FIFO...), or None."""
    path = outbox.path_in(directory)
    if not os.path.lexists(path) or os.path.isfile(path):
        return None
    what = "a directory" if os.path.isdir(path) else "a broken link" if not os.path.exists(path) else "not a regular file"
    return (
        f"{path} is {what}, not the outbox file a run writes (one JSON record per line); nothing was sent and it was "
        f"left as it is. Look at what it holds (an outbox moved into it?): move a real outbox file to {path}, or move "
        "that path away if nothing is left to deliver."
    )


def store_problem(uri: str, source: str, run_uri: str | None):
    """Why the SQLite store at `uri` cannot hold the run's values (missing, empty), or None. Delivering into a store
    that is not there would create an empty one, which has no run to deliver to."""
    from runner.preflight.sqlite_store import sqlite_path

    path = sqlite_path(uri)
    if path is None or (os.path.isfile(path) and os.path.getsize(path) > 0) or os.path.isdir(path):
        return None  # a directory, a damaged file: open_client says what is wrong with it
    state = "does not exist" if not os.path.exists(path) else "is empty"
    hint = f" (this run's directory says it logged to {redact_uri(run_uri)})" if run_uri and run_uri != uri else ""
    return (
        f"the MLflow store {path} ({source}) {state}, so it holds no run to deliver to; nothing was sent, nothing was "
        f"created, and the outbox is kept. Pass the store the run logged to{hint}: --tracking-uri sqlite:///<dir>/mlflow.db "
        "(the directory python -m runner was started from), or run this from that directory."
    )


def report(result: delivery.Delivery, uri: str, source: str, run_uri: str | None) -> str:
    """The one paragraph that says what could not be sent, where it is kept and what to do."""
    parts = []
    if result.damaged:
        lines = "; ".join(f"line {n}: {why}" for n, _, why in result.damaged[:3])
        more = f"; and {len(result.damaged) - 3} more" if len(result.damaged) > 3 else ""
        if result.whole:
            parts.append(
                f"{len(result.damaged)} line(s) of {result.path} are not whole outbox records ({lines}{more}) and were "
                f"not sent: they are kept as they were in {result.damaged_path}. A record cut short by a crash cannot be "
                "sent as it is; look at that file, and remove it once you have (a rerun does not send it again)."
            )
        else:
            parts.append(
                f"{result.path} holds no outbox record ({lines}{more}): a run did not write it, or it is damaged "
                f"throughout. Nothing was sent; its bytes are kept in {result.damaged_path} and the outbox is gone. "
                "Look at that file, and remove it once you have."
            )
    for run_id, why in result.missing.items():
        at = f"the store {redact_uri(uri)} ({source})"
        if why.startswith("deleted"):
            parts.append(
                f"run {run_id} is deleted in {at}: restore it with `MLFLOW_TRACKING_URI={redact_uri(uri)} mlflow runs "
                f"restore --run-id {run_id}`, then run this again. Its values stay in {result.path}."
            )
            continue
        elsewhere = (
            f": this run's directory says it logged to {redact_uri(run_uri)}, so pass --tracking-uri {redact_uri(run_uri)}"
            if run_uri and run_uri != uri
            else ": pass --tracking-uri <that store>"
        )
        parts.append(
            f"run {run_id} is not in {at}: it was logged to another store{elsewhere} (or it was deleted for good). Its "
            f"values stay in {result.path}; run this again with the right store."
        )
    if result.error is not None:
        reason = redact(str(result.error).strip().splitlines()[0] if str(result.error).strip() else "")[:300]
        parts.append(
            f"MLflow at {redact_uri(uri)} stopped taking values part way ({type(result.error).__name__}: {reason}); the "
            f"{result.kept_values} value(s) it did not take stay in {result.path}. Try again when it is up."
        )
    return " ".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.deliver", description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", help="the run's output directory (it holds mlflow_outbox.jsonl)")
    parser.add_argument("--tracking-uri", default=None)
    args = parser.parse_args(argv)
    problem = not_a_run_dir(args.output_dir) or outbox_problem(args.output_dir)
    if problem:
        print(f"Error: {problem}", file=sys.stderr)
        return 2
    if not outbox.exists(args.output_dir):
        print(f"Nothing to deliver: no {outbox.FILE} in {args.output_dir}.")
        return 0
    from runner.errors import ConfigError
    from runner.mlflow_process.store import open_client
    from runner.preflight.probes import tracking_problem

    run_uri = _run_uri(args.output_dir)
    given = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    source = "--tracking-uri" if args.tracking_uri else "MLFLOW_TRACKING_URI" if given else "the run's own store"
    uri = given or run_uri or "sqlite:///mlflow.db"
    problem = tracking_problem(uri)
    if problem:
        print(
            f"Error: MLflow at {redact_uri(uri)} is unreachable ({problem}); the outbox is kept. Try again when it is up.",
            file=sys.stderr,
        )
        return 2
    problem = store_problem(uri, source, run_uri)
    if problem:
        print(f"Error: {problem}", file=sys.stderr)
        return 2
    try:
        client = open_client(uri)
        result = delivery.send_outbox(client, args.output_dir)
    except ConfigError as err:  # a damaged store, an unknown scheme: said by runner.mlflow_process.store
        print(f"Error: {str(err).replace('Nothing was trained.', 'Nothing was sent; the outbox is kept.')}", file=sys.stderr)
        return 2
    except OSError as err:
        print(
            f"Error: {outbox.path_in(args.output_dir)} cannot be read or rewritten ({err.strerror or err}); nothing was "
            "sent. Make it (and its directory) readable and writable for this user, then run this again.",
            file=sys.stderr,
        )
        return 2
    if not result.found:
        print(f"Nothing to deliver: another delivery sent {outbox.FILE} in {args.output_dir} first.")
        return 0
    if result.records or result.sent:
        print(f"delivered {result.sent} metric value(s) of {result.records} record(s) to {redact_uri(uri)}")
    elif result.complete:
        print(f"Nothing to deliver: {result.path} was empty; removed it.")
    if not result.complete:
        print(f"Error: {report(result, uri, source, run_uri)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
