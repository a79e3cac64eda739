"""Fixtures only; the helpers they use (and the tests import) are in tests/helpers.py.

End-to-end fixtures: a session store that parallel runs of the real runner share, the runner itself, a real
MLflow server. Unit-test fixture: `sqlite_uri`, a fresh MLflow SQLite store per test, copied from one migrated
template (MLflow's migrations take seconds; a copy takes milliseconds).
"""

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import ELASTIC, MlflowServer, build_tfds, run_runner

# End-to-end tests that start a machine-wide daemon another file also starts: one scope, so never two at once
SHARED_DAEMONS = {
    "slurm": ("tests/e2e/test_slurm.py::", "test_readme_command[srun:", "test_readme_command[submitit:"),
    "ray": ("tests/e2e/test_ray.py::", "test_readme_command[ray:"),
}


def xdist_scope(nodeid: str) -> str:
    """The unit of work a pytest-xdist worker takes whole: an end-to-end file (its module fixtures, such as a store,
    README's batch of runs, a Slurm cluster or a Ray head, start once), a shared daemon's tests, or one unit test."""
    for daemon, marks in SHARED_DAEMONS.items():
        if any(m in nodeid for m in marks):
            return daemon
    path = nodeid.split("::", 1)[0]
    return path if path.startswith("tests/e2e/") else nodeid


def pytest_xdist_make_scheduler(config, log):
    """`-n 2` schedules by xdist_scope. (pytest-xdist's own loadgroup loses its groups on pytest 9.2:
    pytest-dev/pytest-xdist#1386.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return xdist_scope(nodeid)

    return ByScope(config, log)


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


@pytest.fixture(scope="session")
def elastic_reference(tmp_path_factory, request):
    """reference(executor) -> the model.keras of one uninterrupted process trained as helpers.ELASTIC trains, the
    weights every elastic job must reach (test_ray.py, test_slurm.py): made once per session, whichever pytest-xdist
    worker asks first (a file lock in the workers' shared temporary directory), MLflow off."""
    import fcntl

    # one directory for every xdist worker of this session (each has basetemp/popen-gw<n>); without xdist, this one's
    shared = tmp_path_factory.getbasetemp()
    shared = shared.parent if hasattr(request.config, "workerinput") else shared

    def reference(executor: str) -> Path:
        run_dir = shared / f"elastic-reference-{executor}"
        with open(shared / f"elastic-reference-{executor}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (run_dir / "model.keras").is_file():
                done = run_runner(["strategy=default", f"executor={executor}", *ELASTIC, "mlflow.enabled=false"], shared, run_dir)
                assert done.returncode == 0, done.output[-3000:]
        return run_dir / "model.keras"

    return reference


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory, request):
    """An MLflow SQLite store with MLflow's migrations run once, and nothing else in it: the template `sqlite_uri`
    copies. Kept in pytest's cache for this MLflow version (the migrations take seconds; the next session copies)."""
    import mlflow
    from mlflow import MlflowClient

    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    cache = cache.mkdir("mlflow-template") if cache else None
    kept = cache / f"mlflow-{mlflow.__version__}.db" if cache else None
    if kept and kept.is_file():
        return kept
    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    if kept:
        shutil.copy(path, kept.with_suffix(".tmp"))
        os.replace(kept.with_suffix(".tmp"), kept)  # whole or absent: two sessions at once never see half a file
    return path


@pytest.fixture
def sqlite_uri(migrated_store, tmp_path):
    """A fresh, empty MLflow store of this test's own: sqlite:///<tmp_path>/mlflow.db."""
    path = tmp_path / "mlflow.db"
    shutil.copy(migrated_store, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
    """A data_dir holding a stand-in for MNIST that TensorFlow Datasets itself prepared (tests/tfds_tiny.py, no
    network): mnist/3.0.1, 28x28x1 uint8 images, 10 classes, 128 train and 32 test examples in one file each."""
    root = tmp_path_factory.mktemp("tensorflow_datasets")
    build_tfds(root, "mnist", "3.0.1", side=28, classes=10, train=128, test=32)
    return root


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A real one-machine Slurm cluster (tests/slurm_cluster.py), stopped at the end of the module with every job it
    ran; the module's tests skip with the reason (and the daemons' log tails) where it cannot start."""
    from slurm_cluster import SlurmCluster, SlurmUnavailable

    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except SlurmUnavailable as why:
        pytest.skip(f"no Slurm cluster here: {why}")
    try:
        yield cluster
    finally:
        cluster.stop()
        left = cluster.leftovers()
        assert not left, f"processes of the Slurm cluster left behind: {left}"
