"""runner/launch/rendezvous.py and runner/launch/pods.py (cluster=tf_config with cluster.elastic), in process over
real sockets on 127.0.0.1: agents join worker:0's hub, a silent one is taken as out of touch, a stranger is turned
away, every agent hears the job's end; the settings the agents cannot keep are refused before TensorFlow. The
whole job, with a link down and up between network namespaces: tests/e2e/test_netns.py."""

import json
import socket
import subprocess
import threading
import time

import pytest

from runner.config import schema, validate
from runner.errors import ConfigError
from runner.launch import localhost, pods, rendezvous

import helpers

schema.register()
ELASTIC = ["strategy=multi_worker_mirrored", "cluster=tf_config", "cross_device_ops=ring", "cluster.elastic.enabled=true"]
SPEC = {"worker": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]}


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def hub():
    got, lost = [], []
    port = localhost.free_ports(1)[0]
    h = rendezvous.Hub(
        port, 3, rendezvous.job_token(SPEC), 1.0, lambda i, m: got.append((i, m)), lambda c, why: lost.append((c.index, why))
    )
    h.address, h.got, h.lost = f"127.0.0.1:{port}", got, lost
    yield h
    h.finish({"ok": False, "error": "test over"})


def agent(hub, index, token=None, port=4242, name=None):
    heard, closed = [], []
    channel = rendezvous.connect(
        hub.address, 1.0, lambda c, m: heard.append(m), lambda c, why: closed.append(why), beat=lambda: port
    )
    hello = {"index": index, "token": token or rendezvous.job_token(SPEC), "port": port, "agent": name or f"agent-{index}"}
    channel.send({"hello": hello})
    channel.start()
    channel.heard_messages, channel.closed_why = heard, closed
    return channel


def test_agents_join_report_ports_and_hear_the_jobs_end(hub):
    assert hub.room() == 1 and hub.wait_for_all(0.1) == [1, 2]
    one, two = agent(hub, 1, port=5001), agent(hub, 2, port=5002)
    assert hub.wait_for_all(5) == [] and hub.room() == 3
    assert hub.ports == {1: 5001, 2: 5002}
    one.send({"exit": 0, "generation": 1})
    wait_until(lambda: (1, {"exit": 0, "generation": 1}) in hub.got)
    two.send({"leaving": True})  # its pod got SIGTERM: still connected, given no place in the next generation
    wait_until(lambda: hub.live() == [1])
    assert hub.room() == 2 and hub.channel(2) is not None
    hub.finish({"ok": True})
    wait_until(lambda: {"done": {"ok": True}} in one.heard_messages and {"done": {"ok": True}} in two.heard_messages)
    wait_until(lambda: one.closed and two.closed)


def test_a_silent_agent_is_out_of_touch_within_the_timeout(hub):
    """An agent that says hello and then nothing (its link down: no FIN, no RST) is lost after agent_timeout_sec."""
    sock = socket.create_connection(("127.0.0.1", int(hub.address.rpartition(":")[2])))
    hello = {"hello": {"index": 1, "token": rendezvous.job_token(SPEC), "port": 1, "agent": "a"}}
    sock.sendall((json.dumps(hello) + "\n").encode())
    wait_until(lambda: hub.live() == [1])
    started = time.monotonic()
    wait_until(lambda: hub.lost, timeout=5)
    assert 0.9 < time.monotonic() - started < 3.0
    ((index, why),) = hub.lost
    assert index == 1 and why.startswith("no word for") and hub.live() == []
    sock.close()


def test_a_stranger_or_a_wrong_index_is_turned_away_and_a_rejoin_replaces_the_old_connection(hub):
    stranger = agent(hub, 1, token="another job")
    bad = agent(hub, 7)
    wait_until(lambda: stranger.closed and bad.closed)
    assert {"refused": "its TF_CONFIG names another cluster"} in stranger.heard_messages
    assert {"refused": "no worker index of this job"} in bad.heard_messages
    assert hub.live() == []
    first = agent(hub, 2)
    wait_until(lambda: hub.live() == [2])
    again = agent(hub, 2)  # the same agent back after a link came up, its old connection not yet timed out
    wait_until(lambda: first.closed and hub.channel(2) is not None and hub.lost)
    assert hub.live() == [2] and not again.closed
    twin = agent(hub, 2, name="another pod")  # a second pod given the same index: turned away while the first is in touch
    wait_until(lambda: twin.closed)
    # the hub's heartbeat thread may get a beat out between the refusal and the close: look for the refusal itself
    (refusal,) = [m for m in twin.heard_messages if "refused" in m]
    assert refusal["retry"] and "place is taken" in refusal["refused"]
    assert hub.channel(2) is not None and not again.closed


def test_the_agents_own_environment_is_kept_and_the_runners_variables_sent(monkeypatch):
    monkeypatch.setenv("HOME", "/leader-home")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    task = pods.PodTask("worker", 1, ["python", "-m", "runner", "a=1"], {
        "HOME": "/leader-home", "MLFLOW_TRACKING_URI": "http://mlflow:5000", "TF_CONFIG": "{}", "RUNNER_ELASTIC": "1",
    }, "/leader/worker-1")  # fmt: skip
    orders = []

    class Channel:
        def send(self, message):
            orders.append(message)
            return True

    task.channel = Channel()
    task.start(threading.Lock())
    (order,) = orders
    assert order["start"]["args"] == ["a=1"]
    assert order["start"]["env"] == {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "TF_CONFIG": "{}", "RUNNER_ELASTIC": "1"}
    assert task.proc.poll() is None
    task.channel = None
    task.start(threading.Lock())  # its pod out of touch when the generation starts: lost at once
    assert task.proc.poll() < 0 and "out of touch" in task.exit_note(task.proc.poll())


@pytest.mark.parametrize(
    "tf_config, overrides, said",
    [
        (SPEC, ["strategy=parameter_server", "cross_device_ops=auto"], "restart multi_worker_mirrored jobs so far"),
        (SPEC, [], "checkpoint.dir must name storage every pod reads"),
        ({"worker": SPEC["worker"], "chief": ["127.0.0.1:4"]}, ["checkpoint.dir=/x"], "has chief task(s)"),
        (SPEC, ["checkpoint.dir=/x", "train.global_batch_size=64"], "does not divide over 3 worker(s)"),
        (SPEC, ["checkpoint.dir=/x", "cluster.elastic.min_workers=4"], "min_workers=4 is above the job's cluster.workers=3"),
    ],
)
def test_what_the_agents_cannot_keep_is_refused_before_tensorflow(monkeypatch, tf_config, overrides, said):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": tf_config, "task": {"type": "worker", "index": 1}}))
    cfg = helpers.composed(*ELASTIC, *overrides)
    with pytest.raises(ConfigError) as err:
        validate.check_config(cfg)
        pods.launch(cfg)
    assert said in str(err.value)


def test_a_client_that_resets_at_once_or_sends_garbage_does_not_stop_the_hub(hub):
    """A probe or port scan that connects and resets (SO_LINGER 0), or bytes of another protocol: the hub goes on
    accepting, and a real agent still joins."""
    import struct

    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", int(hub.address.rpartition(":")[2])))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    junk = socket.create_connection(("127.0.0.1", int(hub.address.rpartition(":")[2])))
    junk.sendall(b'[1, 2]\n{"hello": {"index": 1}}\nGET / HTTP/1.1\r\n\r\n')
    one = agent(hub, 1)
    wait_until(lambda: hub.live() == [1] and {"welcome": 1} in one.heard_messages)
    junk.close()


def test_a_remote_trainer_killed_and_never_reported_ends_after_its_bound():
    """After a kill order, a trainer whose agent stays silent about it (a hung pod) is taken as ended after
    agent_timeout_sec + failure_grace_sec, so the launcher's wait never hangs; a report that comes first counts."""
    task = pods.PodTask("worker", 1, ["python", "-m", "runner"], {}, "/x")
    task.report_sec = 0.3

    class Channel:
        def send(self, message):
            return True

    task.channel = Channel()
    task.start(threading.Lock())
    with pytest.raises(subprocess.TimeoutExpired):
        task.proc.wait(timeout=0.05)
    task.signal(9)
    started = time.monotonic()
    assert task.proc.wait() == -9 and 0.2 < time.monotonic() - started < 1.0
    assert "did not report the trainer's end within 0.3s" in task.exit_note(-9)
    task.start(threading.Lock())
    task.proc.end(0)
    task.proc.end(-9, "lost")  # too late: the report counts
    assert task.proc.wait() == 0


@pytest.mark.parametrize(
    "err, kind, code",
    [
        (KeyboardInterrupt(), "Stopped", 130),
        (ConfigError("bad value"), "ConfigError", 2),
        (RuntimeError("boom"), "ClusterError", 3),
    ],
)
def test_the_other_agents_end_with_the_leaders_exit_code(err, kind, code):
    with pytest.raises(Exception) as ended:
        pods._done(json.loads(json.dumps(pods._ended(err))), None, 0.0)
    assert type(ended.value).__name__ == kind and ended.value.exit_code == code
    assert str(ended.value).startswith("the job ")


def test_an_address_that_answers_but_is_no_leader_is_given_up_on_after_the_timeout(tmp_path):
    """Another program on worker:0's address (it accepts, then closes): the follower tries again each second, says so
    once, and ends after cluster.start_timeout_sec naming what answered (before: hundreds of reconnections a second,
    for ever)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def answer():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.sendall(b"<!DOCTYPE HTML>\n")
            conn.settimeout(2.0)  # until the agent hangs up: a close first could fail its hello's send instead
            try:
                while conn.recv(4096):
                    pass
            except OSError:
                pass
            conn.close()

    answering = threading.Thread(target=answer, daemon=True)
    answering.start()
    spec = {"worker": [f"127.0.0.1:{port}", "127.0.0.1:1"]}
    cfg = helpers.composed(f"output_dir={tmp_path}", *ELASTIC, "checkpoint.dir=/x", "cluster.start_timeout_sec=2")
    started = time.monotonic()
    try:
        with pytest.raises(Exception) as err:
            pods.follow(cfg, spec, 1)
    finally:
        stop.set()
        answering.join()
        server.close()
    took = time.monotonic() - started
    assert type(err.value).__name__ == "ClusterError" and "did not take this agent in for 2s" in str(err.value)
    assert "not this job's protocol" in str(err.value) and 2 <= took < 6
