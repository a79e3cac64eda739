"""runner/launch/localhost.py (cluster=localhost), in process: the cluster spec, what each task is started with, and the
supervisor, which runs real tasks built by build_tasks with their `python -m runner` swapped for a tiny
`python -c` script (no TensorFlow), so exits, signals, restarts and a frozen peer happen for real."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from runner.config import schema
from runner.control import contract, procs, stopping
from runner.errors import ClusterError
from runner.launch import localhost
from runner.launch.localhost import TaskPreempted

import helpers
from helpers import ROOT

schema.register()


def composed(tmp_path, *overrides):
    return helpers.composed(f"output_dir={tmp_path}", *overrides)


MWMS = ["strategy=multi_worker_mirrored", "cluster=localhost", "cross_device_ops=ring"]
PS = ["strategy=parameter_server", "cluster=localhost", "executor=custom_loop"]


# --- signal_name, cluster_spec, _task_overrides ---------------------------------------------------------------
@pytest.mark.parametrize(
    "code,text",
    [
        (0, "exit code 0"),
        (3, "exit code 3"),
        (143, "exit code 143"),
        (-9, "killed by SIGKILL"),
        (-15, "killed by SIGTERM"),
        (-200, "killed by signal 200"),
    ],
)
def test_signal_name(code, text):
    assert localhost.signal_name(code) == text


def _ports_of(spec):
    addresses = [a for addrs in spec.values() for a in addrs]
    assert all(a.startswith("127.0.0.1:") for a in addresses), addresses
    ports = [int(a.rsplit(":", 1)[1]) for a in addresses]
    assert len(set(ports)) == len(ports) and all(0 < p < 65536 for p in ports)
    return ports


@pytest.mark.parametrize(
    "overrides,shape",
    [
        (["cluster.workers=3"], {"worker": 3}),
        (["cluster.workers=2", "cluster.chief=true"], {"chief": 1, "worker": 2}),
        (["cluster.workers=2", "cluster.ps=1"], {"worker": 2}),  # ps tasks are parameter_server's only
    ],
)
def test_multi_worker_cluster_spec(tmp_path, overrides, shape):
    spec = localhost.cluster_spec(composed(tmp_path, *MWMS, *overrides))
    assert {job: len(addrs) for job, addrs in spec.items()} == shape
    _ports_of(spec)


def test_parameter_server_cluster_spec_always_has_a_chief(tmp_path):
    spec = localhost.cluster_spec(composed(tmp_path, *PS, "cluster.workers=2", "cluster.ps=2"))
    assert list(spec) == ["chief", "worker", "ps"]
    assert {job: len(addrs) for job, addrs in spec.items()} == {"chief": 1, "worker": 2, "ps": 2}
    _ports_of(spec)


def test_free_ports_are_free_and_distinct():
    import socket

    ports = localhost.free_ports(4)
    assert len(set(ports)) == 4
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free right after: nothing holds them


def test_task_overrides_drop_what_the_launcher_decides_for_each_task():
    given = [
        "strategy=multi_worker_mirrored",
        "cluster=localhost",
        "cluster.workers=2",
        "+cluster.extra=1",
        "~resume",
        "resume=/runs/a",
        "hydra.run.dir=/runs/a",
        "hydra.run.dir.x=1",
        "checkpoint.dir=/ckpt",
        "checkpoint.every_n_steps=5",
        "mlflow.tracking_uri=http://u:p@h",
        "mlflow.run_name=x",
        "clusters=2",
        "train.epochs=3",
    ]
    assert localhost._task_overrides([*given, "strategy.collective_timeout_sec=5"], "multi_worker_mirrored") == [
        "checkpoint.every_n_steps=5",
        "mlflow.run_name=x",
        "clusters=2",
        "train.epochs=3",
        "strategy.collective_timeout_sec=5",
        "strategy=multi_worker_mirrored",  # as validate resolved it (strategy=auto is decided once, in the launcher)
    ]


# --- build_tasks ------------------------------------------------------------------------------------------------
def test_every_task_gets_its_tf_config_run_directory_and_the_launchs_run(tmp_path):
    cfg = composed(tmp_path, *PS, "cluster.workers=2", "cluster.ps=1", "cluster.evaluator=true", "cluster.start_timeout_sec=33")
    overrides = [*PS, "cluster.workers=2", "train.epochs=3", "mlflow.tracking_uri=http://u:secret@h"]
    tasks = localhost.build_tasks(cfg, overrides, run_id="run-123", uri="http://u:secret@h")
    assert [t.name for t in tasks] == ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"]
    spec = json.loads(tasks[0].env["TF_CONFIG"])["cluster"]
    assert {job: len(addrs) for job, addrs in spec.items()} == {"chief": 1, "worker": 2, "ps": 1}
    launch_ids = {t.env[contract.LAUNCH_ID] for t in tasks}
    assert len(launch_ids) == 1 and len(launch_ids.pop()) == 32  # one launch, one marker for all its processes
    for t in tasks:
        tf_config = json.loads(t.env["TF_CONFIG"])
        assert tf_config == {"cluster": spec, "task": {"type": t.type, "index": t.index}}
        assert t.env[contract.ATTACH_RUN] == "run-123"
        assert t.env["MLFLOW_TRACKING_URI"] == "http://u:secret@h" and not any("secret" in a for a in t.argv)
        assert t.env["PYTHONUNBUFFERED"] == "1"
        assert t.run_dir == os.path.join(str(tmp_path), f"{t.type}-{t.index}")
        assert t.argv[:3] == [sys.executable, "-m", "runner"]
        assert t.argv[3:] == [
            "executor=custom_loop",
            "train.epochs=3",
            "strategy=parameter_server",
            "cluster=tf_config",
            "cluster.start_timeout_sec=33.0",
            f"hydra.run.dir={t.run_dir}",
            f"checkpoint.dir={tmp_path}/checkpoints",
        ]
        assert t.proc is None and t.restarts == 0
    assert [t.is_server for t in tasks] == [False, True, True, True, False]  # parameter_server's workers only serve


def test_multi_worker_tasks_all_train_and_share_a_given_checkpoint_directory(tmp_path):
    cfg = composed(tmp_path, *MWMS, "cluster.workers=3", f"checkpoint.dir={tmp_path}/shared")
    tasks = localhost.build_tasks(cfg, [], run_id="r", uri="sqlite:///x.db")
    assert [t.name for t in tasks] == ["worker:0", "worker:1", "worker:2"]
    assert not any(t.is_server for t in tasks)
    assert all(t.argv[-1] == f"checkpoint.dir={tmp_path}/shared" for t in tasks)


# --- supervise, stop_all: real processes ------------------------------------------------------------------------
def script(*lines):
    return [sys.executable, "-c", "\n".join(["import os, signal, sys, time", *lines])]


SERVE = script("time.sleep(120)")  # a ps or worker server: never ends by itself


@pytest.fixture
def cluster(tmp_path):
    """make(overrides, {task name: argv}) -> (cfg, tasks): build_tasks' tasks with their commands replaced; every
    process still running is killed after the test."""
    made = []

    def make(overrides, commands):
        cfg = composed(tmp_path, *overrides)
        tasks = localhost.build_tasks(cfg, [], run_id="run-1", uri=f"sqlite:///{tmp_path}/mlflow.db")
        for t in tasks:
            t.argv = commands[t.name]
        made.extend(tasks)
        return cfg, tasks

    yield make
    for t in made:
        for proc in [t.proc] if t.proc else []:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pump in t.pumps:
            pump.join(timeout=5)
        if t.proc:
            t.proc.stdout.close()


def test_supervise_returns_once_every_trainer_exits_0_and_prefixes_their_output(cluster, capsys):
    cfg, tasks = cluster(
        MWMS,
        {
            "worker:0": script("print('hello from 0')"),
            "worker:1": script("time.sleep(0.3); print('hello from 1')"),
        },
    )
    localhost.supervise(tasks, cfg)
    for t in tasks:
        t.pumps[0].join(timeout=10)
    out = capsys.readouterr().out
    assert "[worker:0] hello from 0\n" in out and "[worker:1] hello from 1\n" in out
    assert [t.proc.returncode for t in tasks] == [0, 0]


def test_under_parameter_server_the_job_ends_with_the_chief_and_stop_all_stops_the_servers(cluster):
    cfg, tasks = cluster(
        [*PS, "cluster.workers=1", "cluster.ps=1"],
        {
            "chief:0": script("time.sleep(0.3)"),
            "worker:0": SERVE,
            "ps:0": SERVE,
        },
    )
    localhost.supervise(tasks, cfg)
    assert [t.proc.poll() for t in tasks] == [0, None, None]
    localhost.stop_all(tasks, grace=10)
    assert [t.proc.returncode for t in tasks] == [0, -signal.SIGTERM, -signal.SIGTERM]


@pytest.mark.parametrize(
    "last_words,reason",
    [
        ("sys.exit(3)", "exit code 3"),
        ("os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
    ],
)
def test_a_trainer_that_fails_stops_the_job_with_an_error_naming_it(cluster, tmp_path, last_words, reason):
    cfg, tasks = cluster(MWMS, {"worker:0": SERVE, "worker:1": script("time.sleep(0.2)", last_words)})
    with pytest.raises(ClusterError) as err:
        localhost.supervise(tasks, cfg)
    dead = tasks[1]
    message = str(err.value)
    assert message.startswith(f"task worker:1 (pid {dead.proc.pid}) stopped: {reason}. The other tasks were stopped.")
    assert f"{dead.run_dir}/runner.log" in message and f"resume={tmp_path}" in message
    assert err.value.exit_code == 3
    localhost.stop_all(tasks, grace=10)
    assert tasks[0].proc.returncode == -signal.SIGTERM


def test_the_killed_trainer_is_named_not_the_peer_that_gave_up_on_it_first(cluster, tmp_path):
    """worker:0 exits 3 (it lost its peer) before worker:1's own end shows, as a Ray actor's death shows late: the
    launcher's error names worker:1, killed, with the resume advice."""
    cfg, tasks = cluster(
        MWMS, {"worker:0": script("sys.exit(3)"), "worker:1": script("time.sleep(0.6)", "os.kill(os.getpid(), 9)")}
    )
    first = None
    try:
        localhost.supervise(tasks, cfg)
    except localhost.TaskLost as lost:
        first = lost
    assert first is not None and first.task is tasks[0]  # the peer that gave up ended first
    named = localhost._the_killed(first, tasks, cfg)
    assert str(named).startswith(f"task worker:1 (pid {tasks[1].proc.pid}) stopped: killed by SIGKILL.")
    assert f"resume={tmp_path}" in str(named) and named.exit_code == 3


def test_a_trainer_that_exits_as_preempted_stops_the_job_as_preempted(cluster):
    cfg, tasks = cluster(MWMS, {"worker:0": SERVE, "worker:1": script(f"sys.exit({stopping.EXIT_CODES[signal.SIGTERM]})")})
    with pytest.raises(TaskPreempted) as err:
        localhost.supervise(tasks, cfg)
    assert err.value.signal_name == "SIGTERM" and err.value.exit_code == 143
    assert "task worker:1 was preempted (SIGTERM)" in str(err.value)


def test_a_task_that_says_it_was_signalled_is_marked_notified(cluster):
    cfg, tasks = cluster(MWMS, {"worker:0": script(f"print('SIGTERM {stopping.NOTICE}')"), "worker:1": script("pass")})
    localhost.supervise(tasks, cfg)
    for t in tasks:
        t.pumps[0].join(timeout=10)
    assert [t.notified for t in tasks] == [True, False]


def test_a_server_that_dies_is_restarted_until_restart_workers_then_the_job_stops(cluster, caplog):
    cfg, tasks = cluster(
        [*PS, "cluster.workers=1", "cluster.ps=1", "cluster.restart_workers=2"],
        {
            "chief:0": SERVE,
            "worker:0": SERVE,
            "ps:0": script("time.sleep(0.1); sys.exit(1)"),
        },
    )
    with caplog.at_level("WARNING", logger="runner"):
        with pytest.raises(ClusterError, match=r"task ps:0 \(pid \d+\) stopped: exit code 1"):
            localhost.supervise(tasks, cfg)
    ps = tasks[2]
    assert ps.restarts == 2 and len(ps.pumps) == 3  # started three times
    restarts = [r.getMessage() for r in caplog.records if "restarting it" in r.getMessage()]
    assert restarts == ["ps:0 stopped (exit code 1); restarting it (1/2)", "ps:0 stopped (exit code 1); restarting it (2/2)"]
    assert tasks[0].proc.poll() is None  # the chief trained on meanwhile


def test_a_frozen_peer_is_the_one_blamed(cluster, tmp_path):
    """A worker stopped with SIGSTOP makes a healthy one give up waiting: the error names the frozen one."""
    frozen_soon = tmp_path / "frozen-soon"
    cfg, tasks = cluster(
        MWMS,
        {
            "worker:0": script(f"open({str(frozen_soon)!r}, 'w').close()", "os.kill(os.getpid(), signal.SIGSTOP)"),
            "worker:1": script(
                f"while not os.path.exists({str(frozen_soon)!r}): time.sleep(0.05)", "time.sleep(0.5)", "sys.exit(1)"
            ),
        },
    )
    with pytest.raises(ClusterError) as err:
        localhost.supervise(tasks, cfg)
    frozen = tasks[0]
    message = str(err.value)
    assert message.startswith(f"task worker:0 (pid {frozen.proc.pid}) was stopped (SIGSTOP or a debugger)")
    assert "task worker:1 gave up waiting for it (exit code 1)" in message
    localhost.stop_all(tasks, grace=0.5)  # a stopped process cannot act on SIGTERM: SIGKILL after the grace period
    assert frozen.proc.returncode == -signal.SIGKILL


def test_the_evaluator_gets_start_timeout_sec_to_finish_after_training(cluster, caplog):
    cfg, tasks = cluster(
        [*PS, "cluster.workers=1", "cluster.ps=1", "cluster.evaluator=true", "cluster.start_timeout_sec=0.5"],
        {
            "chief:0": script("pass"),
            "worker:0": SERVE,
            "ps:0": SERVE,
            "evaluator:0": SERVE,
        },
    )
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="runner"):
        localhost.supervise(tasks, cfg)
    assert time.monotonic() - started >= 0.5
    assert "evaluator:0 did not finish evaluating; stopping it" in caplog.text
    assert tasks[3].proc.poll() is None  # left to stop_all


def test_an_evaluator_that_finishes_is_waited_for(cluster):
    cfg, tasks = cluster(
        [*PS, "cluster.workers=1", "cluster.ps=1", "cluster.evaluator=true"],
        {
            "chief:0": script("pass"),
            "worker:0": SERVE,
            "ps:0": SERVE,
            "evaluator:0": script("time.sleep(0.5)"),
        },
    )
    localhost.supervise(tasks, cfg)
    assert tasks[3].proc.returncode == 0


def test_stop_all_kills_a_task_that_ignores_sigterm_after_the_grace_period(cluster, tmp_path, caplog):
    ready = tmp_path / "ready"
    cfg, tasks = cluster(
        MWMS,
        {
            "worker:0": script(
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)", f"open({str(ready)!r}, 'w').close()", "time.sleep(120)"
            ),
            "worker:1": SERVE,
        },
    )
    lock = threading.Lock()
    for t in tasks:
        t.start(lock)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="runner"):
        localhost.stop_all(tasks, grace=0.5)
    assert 0.5 <= time.monotonic() - started < 10
    assert [t.proc.returncode for t in tasks] == [-signal.SIGKILL, -signal.SIGTERM]
    assert "worker:0 did not stop in time; killing it" in caplog.text


def test_wait_for_lets_tasks_end_by_themselves_within_the_time_given(cluster):
    cfg, tasks = cluster(MWMS, {"worker:0": script("time.sleep(0.2)"), "worker:1": SERVE})
    lock = threading.Lock()
    for t in tasks:
        t.start(lock)
    started = time.monotonic()
    localhost.wait_for(tasks, 1.0)
    assert 0.9 <= time.monotonic() - started < 10
    assert [t.proc.poll() for t in tasks] == [0, None]


def test_signal_to_a_task_that_is_gone_is_harmless(cluster):
    cfg, tasks = cluster(MWMS, {"worker:0": script("pass"), "worker:1": script("pass")})
    lock = threading.Lock()
    for t in tasks:
        t.start(lock)
        t.proc.wait(timeout=30)
    for t in tasks:
        t.signal(signal.SIGTERM)
        t.wait_or_kill(time.monotonic())
    assert [t.proc.returncode for t in tasks] == [0, 0]


def test_the_tasks_die_with_the_launcher():
    """Tasks are started through procs.popen: a launcher killed with SIGKILL leaves none behind."""
    code = (
        "import sys\n"
        "from hydra import compose, initialize_config_dir\n"
        "from runner.config import schema\n"
        "from runner.launch import localhost\n"
        "schema.register()\n"
        f"with initialize_config_dir(config_dir={str(ROOT / 'conf')!r}, version_base='1.3'):\n"
        "    cfg = compose(config_name='config', overrides=['output_dir=/tmp/x', *sys.argv[1:]])\n"
        "tasks = localhost.build_tasks(cfg, [], run_id='r', uri='sqlite:///x.db')\n"
        "import threading; lock = threading.Lock()\n"
        "for t in tasks:\n"
        "    t.argv = [sys.executable, '-c', 'import time; time.sleep(120)']\n"
        "    t.start(lock)\n"
        "print(' '.join(str(t.proc.pid) for t in tasks), flush=True)\n"
        "import time; time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, *MWMS], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2
    parent.kill()
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 10
    while any(procs.start_ticks(p) is not None for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(procs.start_ticks(p) is None for p in pids)


def test_a_task_that_refuses_the_configuration_ends_the_job_with_exit_2_until_checkpoints_exist(cluster):
    """Exit 2 from a trainer is bad input refused before training: the job says so (ConfigError, exit 2), not that a
    task was lost with `resume=` to type; once checkpoints exist, it is a lost task as before (their steps are kept)."""
    from runner.config import layout
    from runner.errors import ConfigError

    refuses = {"worker:0": script("sys.exit(2)"), "worker:1": SERVE}
    cfg, tasks = cluster([*MWMS, "cluster.workers=2"], refuses)
    with pytest.raises(ConfigError, match=r"^task worker:0 refused the configuration \(exit code 2; why is said above"):
        localhost.supervise(tasks, cfg)
    localhost.stop_all(tasks, grace=2)
    os.makedirs(layout.checkpoint_dir(cfg))
    open(os.path.join(layout.checkpoint_dir(cfg), "ckpt-8.index"), "w").close()
    cfg, tasks = cluster([*MWMS, "cluster.workers=2"], refuses)
    with pytest.raises(ClusterError, match=r"task worker:0 \(pid \d+\) stopped: exit code 2\. .* rerun with resume="):
        localhost.supervise(tasks, cfg)
    localhost.stop_all(tasks, grace=2)


def test_with_mlflow_off_the_launcher_creates_no_run_and_its_tasks_attach_to_none(tmp_path, monkeypatch):
    """mlflow.enabled=false under a launcher: no MLflow run, no store (it made ./mlflow.db and a run before), and the
    tasks, still marked as launched, are given no run and no store."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = composed(tmp_path, *MWMS, "mlflow.enabled=false")
    seen = tmp_path / "seen"

    def make_tasks(cfg, overrides, run_id, uri):
        tasks = localhost.build_tasks(cfg, overrides, run_id, uri)
        for t in tasks:  # each task writes what it was given, then ends as a finished trainer does
            t.argv = script(
                f"open({str(seen)!r} + '-' + str(os.getpid()), 'w').write("
                f"repr((os.environ.get({contract.ATTACH_RUN!r}), os.environ.get('MLFLOW_TRACKING_URI'))))"
            )
        return tasks

    summary = localhost.launch(cfg, make_tasks=make_tasks)
    assert summary.get("run_id") is None
    given = {p.read_text() for p in tmp_path.glob("seen-*")}
    assert given == {repr((contract.NO_RUN, None))}, given
    assert not list(tmp_path.rglob("mlflow.db")) and not (tmp_path / "mlruns").exists()
