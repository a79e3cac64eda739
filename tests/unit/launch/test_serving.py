"""runner/launch/serving.py: under cluster=slurm a server task (ps, parameter-server worker) ends once the chief has ended,
and gives up on a chief that never comes up. No TensorFlow: the chief is a plain listening socket here."""

import socket
import threading

import pytest

from runner.launch import serving


class Exited(Exception):
    pass


@pytest.fixture
def exits(monkeypatch):
    calls = []

    def fake_exit(code, message):
        calls.append((code, message))
        raise Exited

    monkeypatch.setattr(serving, "_exit", fake_exit)
    monkeypatch.setattr(serving, "POLL_SEC", 0.05)
    monkeypatch.setattr(serving, "UP_POLL_SEC", 0.05)
    return calls


def test_a_server_exits_0_once_the_chief_it_saw_has_closed_its_port(exits):
    chief = socket.socket()
    chief.bind(("127.0.0.1", 0))
    chief.listen()
    address = f"127.0.0.1:{chief.getsockname()[1]}"
    threading.Timer(0.4, chief.close).start()
    with pytest.raises(Exited):
        serving._exit_when_gone(address, "ps:0", start_timeout=5)
    assert exits == [(0, f"ps:0: the chief at {address} has ended; stopping this server")]


def test_a_server_whose_chief_never_comes_up_exits_3_after_the_start_timeout(exits):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed
    with pytest.raises(Exited):
        serving._exit_when_gone(address, "worker:0", start_timeout=0.3)
    assert exits[0][0] == 3 and "did not come up within cluster.start_timeout_sec=0.3" in exits[0][1]


def test_a_chief_that_stops_answering_is_not_taken_for_ended(exits, monkeypatch):
    """A link down (no answer at all) is not a closed port: the server keeps serving while the chief is unreachable
    and comes back, and exits 0 only once the chief's host refuses the connection (its process has ended)."""
    states = iter([serving.UP, serving.UP, serving.UNREACHABLE, serving.UNREACHABLE, serving.UP] + [serving.CLOSED] * 3)
    monkeypatch.setattr(serving, "_probe", lambda address: next(states))
    with pytest.raises(Exited):
        serving._exit_when_gone("198.18.0.1:2222", "worker:1", start_timeout=5)
    assert exits == [(0, "worker:1: the chief at 198.18.0.1:2222 has ended; stopping this server")]


def test_a_chief_unreachable_past_the_start_timeout_exits_3(exits, monkeypatch):
    states = iter([serving.UP] + [serving.UNREACHABLE] * 1000)
    monkeypatch.setattr(serving, "_probe", lambda address: next(states))
    with pytest.raises(Exited):
        serving._exit_when_gone("198.18.0.1:2222", "ps:0", start_timeout=0.3)
    assert exits[0][0] == 3 and "has not answered for 0.3 s (cluster.start_timeout_sec)" in exits[0][1]
