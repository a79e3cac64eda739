"""Helpers shared by the tests: run the real runner as a subprocess (one process per experiment, as TensorFlow's
logical devices require) against a throw-away MLflow store, follow a run's output live, start a real MLflow
server, and read the results back. Fixtures are in conftest.py."""

import copy
import functools
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# README and the documentation site's guide pages (docs/*.md; not the generated reference nor docs/dev/'s history): the
# pages whose commands tests/e2e/test_readme.py runs, README first
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def doc_text() -> str:
    """README and the guide pages, one after the other."""
    return "\n".join(page.read_text() for page in DOC_PAGES)


def doc_section(title: str) -> str:
    """The text under the guide heading `title` (any level), up to the next heading."""
    text = doc_text()
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#+ |\Z)", text, re.S | re.M)
    assert match, f"no section {title!r} in README or docs/*.md"
    return match.group(1)


def runner_imports(argv, modules=("tensorflow",), cwd=ROOT, timeout=120):
    """Run `python -m runner *argv` in a fresh interpreter; (the finished process, which of `modules` it had imported
    when it exited): the probe of every config-only path (--help, --cfg, refusals) that must not import TensorFlow."""
    probe = (
        "import atexit, sys\n"
        f"atexit.register(lambda: print('LOADED=' + repr(sorted(m for m in {tuple(modules)!r} if m in sys.modules))))\n"
        f"sys.argv = ['runner', *{list(argv)!r}]\n"
        "import runpy; runpy.run_module('runner', run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=timeout, cwd=cwd)
    marks = [line for line in done.stdout.splitlines() if line.startswith("LOADED=")]
    assert marks, done.stdout[-2000:] + done.stderr[-2000:]
    return done, eval(marks[-1][len("LOADED=") :])


def composed(*overrides, hydra: bool = False):
    """The root config as `python -m runner <overrides>` composes it (Hydra's compose API: nothing runs). Each set of
    overrides is composed once per session and handed out as a fresh copy (a copy takes milliseconds, a composition
    a third of a second; checks such as strategy=auto's resolution change the config they are given)."""
    return copy.deepcopy(_composed(tuple(overrides), hydra))


def with_data(overrides, **data):
    """`composed(*overrides)` with data.<key> set to each value of `data` (values Hydra's grammar could not carry)."""
    from omegaconf import OmegaConf

    cfg = composed(*overrides)
    for key, value in data.items():
        OmegaConf.update(cfg, f"data.{key}", value, merge=False)
    return cfg


def data_refusal(cfg) -> str:
    """The one-line ConfigError a data config gets from the pure checks, then its option's probe."""
    import pytest

    from runner.config import validate
    from runner.errors import ConfigError
    from runner.preflight import needs

    with pytest.raises(ConfigError) as err:
        validate.check_config(cfg)
        needs.option_probes(cfg)
    message = str(err.value)
    assert "\n" not in message
    return message


@functools.cache
def _composed(overrides: tuple, hydra: bool):
    from hydra import compose, initialize_config_module

    from runner.config import schema

    schema.register()  # the typed schemas in Hydra's ConfigStore, as the runner's entry point does
    with initialize_config_module(config_module="runner.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)


# Small and quick, but enough steps that a loss has room to fall.
# an elastic job's training (tests/e2e/test_cluster.py, README's elastic command): 60 examples per global batch divide
# over 3, 2 and 1 workers alike; 16 steps an epoch, each ending in a checkpoint (fit's cadence, and the custom loop's)
ELASTIC = [
    "data.num_examples=960",
    "data.eval_examples=120",
    "train.global_batch_size=60",
    "train.epochs=12",  # 192 steps: the smaller job reaches a checkpoint well before its last step, to grow back
    "train.log_every_n_steps=4",
    "checkpoint.every_n_steps=16",
    # one step per call, as these tests were timed: they kill a worker mid-run, and at auto's 4 steps per call the
    # small model's 192 steps could end before the kill landed (auto itself runs in the other e2e runs)
    "train.steps_per_loop=1",
    "train.steps_per_execution=1",
    "executor.verbose=2",  # every progress line, not one a second: the tests wait for a given step's line
]

FAST = [
    "data.num_examples=512",
    "data.eval_examples=128",
    "train.epochs=2",
    "train.global_batch_size=64",
    "train.log_every_n_steps=1",
    "train.optimizer.learning_rate=0.3",
]

# A cluster test's job: 4 steps of 64, every step logged (tests/e2e/test_slurm.py, tests/e2e/test_ray.py).
CLUSTER_TINY = [
    "data.num_examples=512",
    "data.eval_examples=128",
    "train.epochs=1",
    "train.steps_per_epoch=4",
    "train.global_batch_size=64",
    "train.log_every_n_steps=1",
]


@dataclass
class Completed:
    args: list
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_runner(args, cwd, run_dir, tracking_uri=None, env_extra=None, timeout=300) -> Completed:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(PYTHONUNBUFFERED="1", **(env_extra or {}))
    argv = [sys.executable, "-m", "runner", *args, f"hydra.run.dir={run_dir}"]
    if tracking_uri:
        argv.append(f"mlflow.tracking_uri={tracking_uri}")
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return Completed(list(args), proc.returncode, proc.stdout, proc.stderr, Path(run_dir))


def mlflow_run_by_name(uri, experiment, name, deleted=False):
    """The one run named `name`: an active one, as search_runs shows by default, or with deleted=True a deleted one."""
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    view = ViewType.DELETED_ONLY if deleted else ViewType.ACTIVE_ONLY
    found = client.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{name}'", run_view_type=view)
    assert len(found) == 1, f"expected one {'deleted' if deleted else 'active'} run named {name!r}, found {len(found)}"
    return client, found[0]


def assert_refused_run_deleted(uri, experiment, name, result, says):
    """A run refused before its first step (exit 2) left no run among the results: its run is deleted (still FAILED
    with its error, for whoever restores it), none of that name is active, and the error's paragraph says so."""
    _, run = mlflow_run_by_name(uri, experiment, name, deleted=True)
    assert run.info.lifecycle_stage == "deleted" and run.info.status == "FAILED"
    assert says in run.data.tags["error"]
    from mlflow import MlflowClient

    exp = MlflowClient(uri).get_experiment_by_name(experiment)
    active = MlflowClient(uri).search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{name}'")
    assert not active, f"{name}: an active run is left: {[r.info.status for r in active]}"
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert says in error and f"The MLflow run {run.info.run_id} was deleted (nothing was trained)" in error, error
    assert not (result.run_dir / "mlflow_run_id").exists()  # the directory holds no run: resume= has nothing to continue
    return run


def load_weights(path):
    """A saved tf_keras model's weights (model.keras), for comparing a distributed run's with one process's."""
    import tf_keras

    return tf_keras.models.load_model(path, compile=False).get_weights()


def check_elastic_run(uri, experiment, name, job_model, reference_model):
    """What every elastic job of ELASTIC that lost one worker and grew back must show (tests/e2e/test_tfrecord.py,
    test_ray.py): the weights of one uninterrupted process (1e-5), one FINISHED run unmarked by the generations
    stopped for a resize, world size 3 -> 2 -> 3 from the loss's checkpoint on, one restart, every logged step once.
    Returns (the loss's record, the regrowth's record) from elastic/resizes.json."""
    import json

    import numpy as np

    single = load_weights(reference_model)
    for a, b in zip(load_weights(job_model), single, strict=True):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), np.max(np.abs(a - b))
    client, run = mlflow_run_by_name(uri, experiment, name)
    assert run.info.status == "FINISHED" and not {"error", "stopped_by"} & set(run.data.tags), run.data.tags
    assert run.data.metrics["cluster/restarts"] == 1
    sizes = sorted(client.get_metric_history(run.info.run_id, "cluster/world_size"), key=lambda m: m.timestamp)
    assert [m.value for m in sizes] == [3, 2, 3], [(m.step, m.value) for m in sizes]
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert sorted(steps) == list(range(4, 193, 4)), steps  # every logged step once: the redone ones not again
    lost, back = json.loads(open(client.download_artifacts(run.info.run_id, "elastic/resizes.json")).read())
    assert (lost["from_workers"], lost["to_workers"]) == (3, 2) and sizes[1].step == lost["checkpoint_step"] >= 16
    assert (back["from_workers"], back["to_workers"]) == (2, 3) and back["checkpoint_step"] > lost["checkpoint_step"]
    return run, lost, back


def processes_with(*entries: str) -> list[int]:
    """PIDs of live processes whose environment holds every entry: `NAME` (any value) or `NAME=value` (exactly).

    Scoped to this pytest process's own: under pytest-xdist each worker's children inherit its PYTEST_XDIST_WORKER,
    so a test never counts what a test on the other worker started meanwhile."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    wanted = [*entries, *([f"PYTEST_XDIST_WORKER={worker}"] if worker else [])]
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        names = {e.split(b"=", 1)[0] for e in env}
        if all((w.encode() in env) if "=" in w else (w.encode() in names) for w in wanted):
            found.append(int(pid))
    return found


def leftover_processes(marker_env="RUNNER_LAUNCH_ID"):
    """PIDs of this session's processes that still carry a launcher's marker in their environment."""
    return processes_with(marker_env)


class LiveRun:
    """A runner process whose merged output is read line by line while it runs."""

    def __init__(self, args, cwd, run_dir, tracking_uri, prefix=(), env=None):
        """`prefix`: what starts the runner (salloc's arguments); `env`: the environment instead of this process's."""
        import queue
        import threading

        env = {k: v for k, v in (env or os.environ).items() if k != "MLFLOW_TRACKING_URI"}
        env["PYTHONUNBUFFERED"] = "1"
        argv = [*prefix, sys.executable, "-m", "runner", *args, f"hydra.run.dir={run_dir}", f"mlflow.tracking_uri={tracking_uri}"]
        # a session of its own, as a terminal gives a command: ctrl_c() reaches its whole process group
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self.lines, self._queue = [], queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, predicate, timeout):
        """The first line for which predicate(line) is true; fails after timeout seconds."""
        import queue
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if predicate(line):
                return line
        raise AssertionError("expected line never came; output:\n" + "".join(self.lines[-60:]))

    def ctrl_c(self):
        """What a terminal's Ctrl-C does: SIGINT to every process of the command's process group."""
        import signal

        os.killpg(self.proc.pid, signal.SIGINT)

    def finish(self, timeout):
        """(exit code, whole output)."""
        code = self.proc.wait(timeout=timeout)
        while True:
            line = self._queue.get(timeout=10)
            if line is None:
                break
            self.lines.append(line)
        return code, "".join(self.lines)


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 over an SQLite store, which tests stop and start again mid-run."""

    def __init__(self, root: Path):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.root, self.proc = root, None
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self, timeout=60):
        import time
        import urllib.request

        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{self.root}/server.db",
                "--default-artifact-root",
                str(self.root / "artifacts"),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return self
            except OSError:
                time.sleep(0.3)
        raise AssertionError("mlflow server did not come up")

    def stop(self):
        import signal

        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # gone at once, as a crashed server would be
            self.proc.wait()


def write_png(path, pixels, channels: int = 1):
    """A PNG from rows of 8-bit values (channels values per pixel, interleaved), in plain Python (zlib): no Pillow."""
    import struct
    import zlib

    height, width = len(pixels), len(pixels[0]) // channels
    color = {1: 0, 3: 2, 4: 6}[channels]  # grayscale, RGB, RGBA

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes(row) for row in pixels)  # filter type 0 per row
    header = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


def write_bmp(path, pixels):
    """A 24-bit BMP from rows of RGB values (3 per pixel), in plain Python: decode_image refuses it as grayscale."""
    import struct

    height, width = len(pixels), len(pixels[0]) // 3
    pad = (4 - width * 3 % 4) % 4
    rows = b"".join(bytes(v for x in range(width) for v in row[3 * x : 3 * x + 3][::-1]) + b"\0" * pad for row in pixels[::-1])
    header = struct.pack("<2sIHHI", b"BM", 54 + len(rows), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(rows), 2835, 2835, 0, 0)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(header + info + rows)


def write_image_folder(root, classes=("circle", "square"), per_class=12, size=8):
    """root/<class>/<i>.png: tiny RGB images whose class shows (a bright left or right half), with some noise."""
    import random

    rng = random.Random(0)
    for c, name in enumerate(classes):
        for i in range(per_class):
            rows = []
            for _ in range(size):
                row = []
                for x in range(size):
                    bright = (x < size // 2) == (c % 2 == 0)
                    row += [min(255, (200 if bright else 30) + rng.randrange(40))] * 3
                rows.append(row)
            write_png(Path(root) / name / f"{i:03d}.png", rows, channels=3)
    return Path(root)


def build_tfds(data_dir, name="tiny_shapes", version="1.0.0", side=8, classes=4, train=96, test=32):
    """A tiny dataset prepared by TensorFlow Datasets itself (tests/tfds_tiny.py, in a process of its own: it imports
    TensorFlow) into data_dir/<name>/<version>/; nothing is downloaded."""
    argv = [sys.executable, str(ROOT / "tests" / "tfds_tiny.py"), str(data_dir), name, version, str(side), str(classes)]
    proc = subprocess.run([*argv, str(train), str(test)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(data_dir) / name / version


def serve_and_predict(argv, cwd, env, inputs, log_path, timeout=150):
    """Start `mlflow models serve ...` (argv, its port from `-p`) in its own process group, wait for /ping, POST
    {"inputs": inputs} to /invocations, and stop the whole group whatever happens. Returns (answer, pids left alive)."""
    import json
    import signal
    import time
    import urllib.request

    port = argv[argv.index("-p") + 1]
    with open(log_path, "w") as log:
        server = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while True:
                assert server.poll() is None, Path(log_path).read_text()[-3000:]
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"mlflow models serve did not answer /ping in {timeout} s"
                time.sleep(0.5)
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/invocations",
                data=json.dumps({"inputs": inputs}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60) as r:
                answer = json.loads(r.read())
        finally:
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(server.pid, sig)
                except ProcessLookupError:
                    break
                stop_at = time.monotonic() + wait
                while live_group_members(server.pid) and time.monotonic() < stop_at:
                    server.poll()
                    time.sleep(0.2)
                if not live_group_members(server.pid):
                    break
    return answer, live_group_members(server.pid)


def live_group_members(pgid: int) -> list[int]:
    """Processes of a process group that are not zombies (a container's init may leave those unreaped)."""
    live = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                live.append(int(entry))
    return live


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- Kubernetes manifests (python -m runner.kubernetes) against the schemas the API server uses ------------------
KUBERNETES = "1.37.0"  # the newest release kubernetes-validate holds
# the openAPIV3Schema of JobSet v0.12.0's CRD (kubernetes-sigs/jobset,
# config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml), descriptions left out
JOBSET_SCHEMA = ROOT / "tests" / "data" / "jobset-v0.12.0-v1alpha2.schema.json.gz"


def _strict(schema):
    """The CRD schema as the API server's strict field validation reads it: a field it does not list is an error."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        open_ended = "additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in schema and not open_ended:
            schema["additionalProperties"] = False
        return schema
    return [_strict(s) for s in schema] if isinstance(schema, list) else schema


def validate_manifest(document):
    import gzip
    import json

    import jsonschema
    import kubernetes_validate

    if document["apiVersion"] == "jobset.x-k8s.io/v1alpha2":
        jsonschema.validate(document, _strict(json.loads(gzip.decompress(JOBSET_SCHEMA.read_bytes()))))
        for job in document["spec"]["replicatedJobs"]:  # the Jobs inside, against Kubernetes' own Job schema
            validate_manifest({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job["name"]}, **job["template"]})
    else:
        kubernetes_validate.validate(document, KUBERNETES, strict=True)
