"""Thread priorities. On Linux a thread's niceness is its own, and the threads it starts inherit it: work that can
wait (imports ahead, metric delivery and sampling during training) runs in threads below normal priority, while
what a user waits for (a run's start, the model logged at its end) runs in threads that never were."""

import os
import sys
import threading

BACKGROUND = 10  # below training in the CPU's queue: its work waits, training's steps do not
LOWEST = 19  # runs only when nothing of normal priority waits


def lower_this_thread(niceness: int) -> None:
    """This thread, and the threads it starts from now on, at `niceness` at least. A process may lower its threads'
    priority but not raise it back (root aside): a thread that does urgent work later must not be lowered."""
    if not sys.platform.startswith("linux"):  # elsewhere a thread's id is no process id for setpriority
        return
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < niceness:
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
    except (AttributeError, OSError):  # not Linux, or not allowed: the thread keeps its priority
        pass


def threads_back_to_normal() -> None:
    """Every lowered thread of this process back to niceness 0, where Linux allows it (root, or a raised RLIMIT_NICE)."""
    if not sys.platform.startswith("linux"):
        return
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            if os.getpriority(os.PRIO_PROCESS, int(tid)) > 0:
                os.setpriority(os.PRIO_PROCESS, int(tid), 0)
        except (OSError, ValueError):
            pass


def in_background(target, niceness: int = BACKGROUND):
    """`target`, run at `niceness` in whatever thread calls it (a thread's target)."""

    def lowered(*args, **kwargs):
        lower_this_thread(niceness)
        return target(*args, **kwargs)

    return lowered
