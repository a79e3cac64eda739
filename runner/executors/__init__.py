"""Executors: given a strategy, a model built in its scope, data and a reporter, train and evaluate.

`fit` is Keras' Model.fit (fit.py). `custom_loop` is the guide's loop: runner/executors/loop.py owns its epochs,
logging, checkpoints and stops, and an inner loop runs the steps, in this process (custom_loop.py) or, under
parameter_server, scheduled by the coordinator (ps_loop.py). A new executor is a name here and a module.
"""

from runner.errors import ConfigError
from runner.executors.base import Job, Result


def _fit(job: Job) -> Result:
    from runner.executors.fit import run_fit

    return run_fit(job)


def _custom_loop(job: Job) -> Result:
    if job.parameter_server:
        from runner.executors.ps_loop import run_ps_loop

        return run_ps_loop(job)
    from runner.executors.custom_loop import run_custom_loop

    return run_custom_loop(job)


_RUNS = {"fit": _fit, "custom_loop": _custom_loop}
EXECUTORS = tuple(_RUNS)


def get_executor(name: str):
    """The function that runs executor `name` on a Job; a ConfigError naming the valid executors otherwise."""
    if name not in _RUNS:
        raise ConfigError(f"executor.name={name!r} is not an executor; valid executors: {', '.join(EXECUTORS)}.")
    return _RUNS[name]


__all__ = ["EXECUTORS", "Job", "Result", "get_executor"]
