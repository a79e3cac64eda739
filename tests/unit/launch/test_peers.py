"""runner/launch/peers.py: TensorFlow's errors when a peer is lost, as TF 2.21 words them (copied from real runs across
network namespaces, tests/e2e/test_netns.py), turned into one message naming the task. No TensorFlow needed."""

from runner.errors import ClusterError
from runner.launch import peers

JOBS = {"worker": ["198.18.0.1:2222", "198.18.0.2:2222"]}


def tf_error(name, text):
    return type(name, (Exception,), {})(text)


def test_the_leader_names_the_task_that_stopped_sending_heartbeats(tmp_path):
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-160"\n')
    err = tf_error(
        "UnavailableError",
        "Graph execution error:\n...Collective ops is aborted by: Error reported from /job:worker/task:1: The following "
        "tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have crashed.",
    )
    lost = peers.lost_peer(err, "worker:0", JOBS, "/out/w0", str(tmp_path))
    assert isinstance(lost, ClusterError) and lost.exit_code == 3
    text = str(lost)
    assert text.startswith("task worker:0 lost contact with worker:1 (198.18.0.2:2222): it stopped answering")
    assert f"the latest checkpoint is step 160 in {tmp_path}" in text and "resume=/out/w0" in text


def test_the_cut_off_task_names_the_coordination_leader():
    err = tf_error(
        "DeadlineExceededError",
        "Collective ops is aborted by: Deadline Exceeded\n\nRPC: /tensorflow.CoordinationService/Heartbeat\n"
        "The error could be from a previous operation. [[{{node while/CollectiveReduceV2}}]]",
    )
    text = str(peers.lost_peer(err, "worker:1", JOBS, "/out/w1", None))
    assert text.startswith("task worker:1 lost contact with worker:0 (198.18.0.1:2222): it did not answer")
    assert "no checkpoint was written" in text


def test_a_collective_error_naming_an_address_blames_its_task():
    err = tf_error("UnavailableError", "Collective ops is aborted by: failed to connect to all addresses; ipv4:198.18.0.2:2222")
    assert "lost contact with worker:1 (198.18.0.2:2222)" in str(peers.lost_peer(err, "worker:0", JOBS))
    ring = tf_error(  # a ring's abort lists its members too: the unreachable address names the lost one
        "UnavailableError",
        "Collective ops is aborted by: [_Derived_]Aborting RingReduce with /job:worker/replica:0/task:2 "
        "/job:worker/replica:0/task:1 failed to connect to all addresses; ipv4:198.18.0.2:2222",
    )
    text = str(peers.lost_peer(ring, "worker:0", {**JOBS, "worker": [*JOBS["worker"], "198.18.0.3:2222"]}))
    assert "lost contact with worker:1 (198.18.0.2:2222): " in text and "worker:2" not in text


def test_other_errors_and_single_processes_are_left_alone():
    assert peers.lost_peer(ValueError("stopped sending heartbeats"), "worker:0", JOBS) is None
    assert peers.lost_peer(tf_error("UnavailableError", "stopped sending heartbeats /job:worker/task:1"), "worker:0", {}) is None
    assert peers.lost_peer(tf_error("InvalidArgumentError", "shapes"), "worker:0", JOBS) is None


def test_tensorflows_watcher_threads_end_on_a_lost_peer_in_one_line(caplog, monkeypatch):
    import logging
    import threading

    printed = []  # what the hook before (Python's own: a traceback on stderr) is handed
    monkeypatch.setattr(threading, "excepthook", lambda args: printed.append(args.thread.name))
    peers.quiet_watcher_threads()
    unavailable = type("UnavailableError", (Exception,), {})

    def raising(error):
        def run():
            raise error

        return run

    caplog.set_level(logging.INFO, logger="runner")
    for name, error in (("PeerTerminationWatcher-1", unavailable("Socket closed\nmore")), ("mine", ValueError("bug"))):
        thread = threading.Thread(target=raising(error), name=name)
        thread.start()
        thread.join()
    assert printed == ["mine"]  # another thread's error is still printed as Python prints it
    assert "TensorFlow's PeerTerminationWatcher-1 thread ended (UnavailableError: Socket closed): a peer is gone" in caplog.text


def test_a_peer_that_only_passed_the_abort_on_is_not_blamed():
    """worker:1 killed: worker:0's error names worker:1 (connection reset) and worker:2, whose answer was the abort it
    had from worker:1. worker:2 is alive: only worker:1 is lost (an elastic job said both)."""
    jobs = {"worker": ["127.0.0.1:1000", "127.0.0.1:1001", "127.0.0.1:1002"]}
    err = tf_error(
        "UnavailableError",
        "Collective ops is aborted by: recvmsg:Connection reset by peer\n"
        "Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling "
        "/tensorflow.WorkerService/RecvBuf:\n"
        ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}\n'
        "The error could be from a previous operation. Restart your program to reset.\n"
        "Additional GRPC error information from remote target /job:worker/replica:0/task:2 while calling "
        "/tensorflow.WorkerService/RecvBuf:\n"
        ':UNKNOWN:Error received from peer  {grpc_message:"Collective ops is aborted by: recvmsg:Connection reset by '
        "peer\\nAdditional GRPC error information from remote target /job:worker/replica:0/task:1 while calling "
        '/tensorflow.WorkerService/RecvBuf:\\n:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:\\"recvmsg:'
        'Connection reset by peer\\"}", grpc_status:14}',
    )
    text = str(peers.lost_peer(err, "worker:0", jobs))
    assert "lost contact with worker:1 (127.0.0.1:1001): " in text and "worker:2" not in text, text
