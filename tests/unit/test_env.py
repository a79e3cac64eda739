"""runner.env: one glibc malloc arena per thread (the threads of a training process outnumber glibc's default)."""

import os
import subprocess
import sys

import pytest

from runner import env

# A fresh interpreter: spread the arenas (or not), start more threads than glibc's default limit where the runner's
# limit allows it, each allocating past pymalloc, and count the arenas malloc_info reports while they all live.
PROBE = """
import ctypes, os, sys, threading
from runner import env
print(env.spread_malloc_arenas() if sys.argv[1] == "spread" else None)
n = min(8 * os.cpu_count() + 8, env.MIN_ARENAS - 8)
held, ready, done = [], threading.Barrier(n + 1), threading.Event()
def work():
    held.append(bytearray(1 << 16))
    ready.wait()
    done.wait()
threads = [threading.Thread(target=work) for _ in range(n)]
for t in threads:
    t.start()
ready.wait()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
path = sys.argv[2]
f = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(f))
libc.fclose(ctypes.c_void_p(f))
print(open(path).read().count("<heap nr="), n, 8 * os.cpu_count())
done.set()
"""


def arenas(tmp_path, mode: str, **environ) -> tuple[str, int, int, int]:
    mine = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")}  # the developer's own
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, str(tmp_path / "malloc_info.xml")],
        capture_output=True,
        text=True,
        check=True,
        env={**mine, **environ},
    ).stdout.split("\n")
    heaps, threads, default = (int(v) for v in out[1].split())
    return out[0], heaps, threads, default


glibc = pytest.mark.skipif(not env.glibc(), reason="glibc's malloc only")


@glibc
def test_every_thread_gets_its_own_arena_past_glibcs_default_limit(tmp_path):
    said, heaps, threads, default = arenas(tmp_path, "spread")
    assert said == "True"
    assert heaps > threads  # the main arena and one per thread
    if threads > default:  # a machine of fewer than 15 cores: more threads than glibc's own limit
        said, heaps, threads, default = arenas(tmp_path, "as is")
        assert heaps <= default  # what the runner's processes had: threads sharing arenas, the main thread's too


@glibc
@pytest.mark.parametrize("environ", [{"MALLOC_ARENA_MAX": "2"}, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}])
def test_a_limit_the_user_set_is_kept(tmp_path, environ):
    said, heaps, _, _ = arenas(tmp_path, "spread", **environ)
    assert said == "False" and heaps <= 2


def test_nothing_is_done_where_malloc_is_not_glibcs(monkeypatch):
    monkeypatch.setattr(os, "confstr", lambda name: "")  # musl answers no glibc version
    assert env.spread_malloc_arenas() is False
