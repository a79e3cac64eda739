"""Shared helpers: run the real runner as a subprocess (one process per experiment, as TensorFlow's
logical devices require) against a throw-away MLflow store, and read the results back."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Small and quick, but enough steps that a loss has room to fall.
FAST = [
    "data.num_examples=512",
    "data.eval_examples=128",
    "train.epochs=2",
    "train.global_batch_size=64",
    "train.log_every_n_steps=1",
    "train.optimizer.learning_rate=0.3",
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


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    """A fresh SQLite MLflow store, created once before parallel runs use it (its migrations race otherwise)."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{root}/mlflow.db"
    MlflowClient(uri).search_experiments()
    return root, uri


@pytest.fixture(scope="session")
def runner(store):
    """run(name, args) -> Completed; runs(dict of name -> args) runs them two at a time (2 cores)."""
    root, uri = store

    def run(name, args, **kw):
        return run_runner([*args, f"mlflow.run_name={name}"], cwd=root, run_dir=root / "runs" / name, tracking_uri=uri, **kw)

    def runs(jobs: dict, **kw):
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {name: pool.submit(run, name, args, **kw) for name, args in jobs.items()}
            return {name: f.result() for name, f in futures.items()}

    run.many = runs
    run.uri = uri
    run.root = root
    return run


def mlflow_run_by_name(uri, experiment, name):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    found = client.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{name}'")
    assert len(found) == 1, f"expected one run named {name!r}, found {len(found)}"
    return client, found[0]
