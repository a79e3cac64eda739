"""sweep.parallel's slots without TensorFlow (runner.sweeps.parallel): the machine divided between the slots, and the
next job started the moment any ends, with real threads."""

import threading
import time

import pytest

from runner.control import contract
from runner.errors import ConfigError
from runner.sweeps import parallel


def test_each_slot_gets_its_own_cpus_and_gpus():
    envs = parallel.shares(3, [0, 1, 2, 3, 4, 5, 6], ["0", "1", "2", "3", "4", "5"])
    assert [e[contract.CPUS] for e in envs] == ["0,1,2", "3,4", "5,6"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3", "4,5"]
    assert parallel.shares(2, [4, 9], []) == [{contract.CPUS: "4"}, {contract.CPUS: "9"}]


@pytest.mark.parametrize(
    ("n", "cpus", "gpus", "why"),
    [(3, [0, 1], [], "2 CPUs this process may use"), (3, list(range(8)), ["0", "1"], "2 GPUs")],
)
def test_more_slots_than_cpus_or_gpus_is_refused(n, cpus, gpus, why):
    with pytest.raises(ConfigError, match=rf"sweep.parallel={n}: this machine has {why}.*Set sweep.parallel=2 or less"):
        parallel.shares(n, cpus, gpus)


def test_parallel_is_the_basic_launchers():
    parallel.check(1, "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "basic")
    parallel.check(2, "basic", "basic")
    with pytest.raises(ConfigError, match="sweep.parallel=2 runs the jobs side by side under Hydra's basic launcher"):
        parallel.check(2, "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "basic")


def test_the_next_job_starts_when_any_ends_not_when_the_batch_does():
    slots = parallel.Slots(parallel.shares(2, [0, 1], []), stop_jobs=None, stopped=None)
    began, lock = {}, threading.Lock()

    def job(name, seconds):
        def work(env):
            with lock:
                began[name] = (time.monotonic(), env[contract.CPUS])
            time.sleep(seconds)
            return name

        return work

    t0 = time.monotonic()
    futures = [
        slots.submit(job(name, s), f"#{i}") for i, (name, s) in enumerate([("long", 0.6), ("a", 0.1), ("b", 0.1), ("c", 0.1)])
    ]
    slots.wait_all()
    assert [f.result() for f in futures] == ["long", "a", "b", "c"]
    assert began["long"][1] != began["a"][1]  # side by side, on CPUs of their own
    assert all(began[n][0] - t0 < 0.45 for n in "abc")  # a, b, c one after another beside the long one
    assert time.monotonic() - t0 < 0.9  # 0.6 s of the long job, not 0.6 + 0.1 for a batch barrier after it
