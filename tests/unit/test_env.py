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


@pytest.fixture(scope="module")
def latin1_locale(tmp_path_factory):
    """An ISO-8859-1 locale made here (localedef into a directory of the test's own: LOCPATH), as a machine set up
    with LANG=en_US.ISO-8859-1 has; skipped where glibc's locale sources are not installed."""
    where = tmp_path_factory.mktemp("locales")
    made = subprocess.run(["localedef", "-i", "en_US", "-f", "ISO-8859-1", str(where / "en_US.ISO-8859-1")], capture_output=True)
    if made.returncode not in (0, 1) or not (where / "en_US.ISO-8859-1").exists():  # 1: made, with warnings
        pytest.skip(f"no ISO-8859-1 locale can be made here (localedef: {made.stderr.decode(errors='replace')[:200]})")
    return {**os.environ, "LOCPATH": str(where), "LC_ALL": "en_US.ISO-8859-1"}


def test_under_a_latin1_locale_the_runner_starts_again_in_utf8_mode_with_the_arguments_as_typed(latin1_locale):
    """TensorFlow reads and writes paths as UTF-8: Python must name files the same way (runner.env.utf8_paths), or a
    directory beyond ASCII is two directories (checkpoints in one, the run's files in the other)."""
    probe = (
        "import sys; from runner import env; env.utf8_paths(); "
        "print(sys.flags.utf8_mode, sys.getfilesystemencoding(), ascii(sys.argv[1]))"
    )
    env_ = {k: v for k, v in latin1_locale.items() if k != "PYTHONUTF8"}
    before = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys.getfilesystemencoding())"], env=env_, capture_output=True, text=True
    )
    assert before.stdout.strip() == "iso8859-1", before  # the locale took: Python names files in Latin-1 under it
    done = subprocess.run([sys.executable, "-c", probe, "rés"], env=env_, capture_output=True, text=True, encoding="utf-8")
    assert done.stdout.split() == ["1", "utf-8", "'r\\xe9s'"], done  # in UTF-8 mode, the argument as the user typed it
