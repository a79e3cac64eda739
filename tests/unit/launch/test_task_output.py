"""What reaches the terminal of a run's output: progress lines without a terminal are paced (runner.control.pace), by
the run itself and by a launcher for its tasks, which print every line for it to read their steps from; TensorFlow's
own C++ error lines from a launcher's tasks go to a file of the task's."""

import threading

import pytest

from runner.config import schema
from runner.control import contract, pace
from runner.executors import base
from runner.launch import localhost

import helpers

schema.register()


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_line_a_second_the_first_and_the_last_always():
    clock = Clock()
    p = pace.Pace(1.0, clock)
    shown = []
    for step in range(1, 1001):  # 1,000 lines in 5 s
        clock.now = step * 0.005
        if p.due(last=step == 1000):
            shown.append(step)
    assert shown[0] == 1 and shown[-1] == 1000
    assert len(shown) == 6  # about steps 1, 201, 401, 601, 801 and the last
    gaps = [b - a for a, b in zip(shown, shown[1:-1])]
    assert all(200 <= g <= 201 for g in gaps), shown  # a second apart (floating-point clock)


def test_no_terminal_paces_a_launched_task_prints_every_line_and_2_always(monkeypatch):
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    monkeypatch.delenv(contract.TASK_ROLE, raising=False)
    assert base.progress_mode("auto") == "paced"
    assert base.progress_mode("2") == "lines"
    monkeypatch.setenv(contract.TASK_ROLE, "trainer")
    assert base.progress_mode("auto") == "lines"  # the launcher reads them and paces what it shows
    assert base.progress_mode("0") == base.progress_mode("1") == "lines"  # and hides them, or shows no bar
    for mode, stop, shown in (("lines", 100, list(range(1, 101))), ("paced", 100, [1, 100]), ("paced", 37, [1, 37])):
        lines, logged = base.ProgressLines(mode, 100), []
        monkeypatch.setattr(base.log, "info", logged.append)
        for step in range(1, stop + 1):
            lines.show(step, lambda step=step: step)
        lines.end()  # training ended: at its last step, or early (early stopping at 37: its line still shown)
        assert logged == shown, (mode, stop)


@pytest.mark.parametrize(
    "verbose,shown",
    [("auto", ["1/8", "8/8"]), ("1", ["1/8", "8/8"]), ("2", [f"{s}/8" for s in range(1, 9)]), ("0", [])],
)
def test_the_launcher_paces_what_it_shows_and_still_reads_every_step(tmp_path, capsys, verbose, shown):
    cfg = helpers.composed(
        f"output_dir={tmp_path}", "strategy=multi_worker_mirrored", "cluster=localhost", f"executor.verbose={verbose}"
    )
    task = localhost.build_tasks(cfg, [], "run", "sqlite:///x.db")[0]
    lock = threading.Lock()
    task.heard("[00:00:00][INFO] starting\n", lock)
    for step in range(1, 9):
        task.heard(f"[00:00:00][INFO] epoch 2/2 step {step}/8 loss 0.5\n", lock)
        assert task.step == 8 + step  # every line read, shown or not
    out = capsys.readouterr().out
    assert "starting" in out  # other lines are never paced
    assert [line.split(" step ")[1].split()[0] for line in out.splitlines() if " step " in line] == shown


def test_tensorflows_own_error_lines_go_to_the_tasks_file_and_its_own_lines_still_show(tmp_path, capsys):
    """What a survivor printed when a peer was killed (an elastic job's 20 lines of gRPC errors): kept in
    <task dir>/tensorflow.log, named once; the task's own paragraph and log lines come through."""
    cfg = helpers.composed(f"output_dir={tmp_path}", "strategy=multi_worker_mirrored", "cluster=localhost")
    task = localhost.build_tasks(cfg, [], "run", "sqlite:///x.db")[0]
    said = [
        "[12:24:34][INFO] training with Model.fit: 30 epochs\n",
        "E0000 00:00:1796646282.148139   27056 ring_alg.cc:291] Aborting RingReduce with UNAVAILABLE: recvmsg\n",
        "Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling RecvBuf:\n",
        ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}\n',
        "The error could be from a previous operation. Restart your program to reset.\n",
        "E0000 00:00:1796646282.148190   27056 base_collective_executor.cc:252] StartAbort UNAVAILABLE\n",
        "Error: task worker:0 lost contact with worker:1 (127.0.0.1:52399); stopping for the elastic launcher\n",
        "Traceback (most recent call last):\n",
    ]
    for line in said:
        task.heard(line, threading.Lock())
    out = capsys.readouterr().out.splitlines()
    kept = (tmp_path / "worker-0" / "tensorflow.log").read_text()
    assert kept == "".join(said[1:6])
    assert out == [
        "[worker:0] [12:24:34][INFO] training with Model.fit: 30 epochs",
        f"[worker:0] TensorFlow's own error lines go to {tmp_path / 'worker-0' / 'tensorflow.log'}",
        "[worker:0] Error: task worker:0 lost contact with worker:1 (127.0.0.1:52399); stopping for the elastic launcher",
        "[worker:0] Traceback (most recent call last):",
    ]
