"""Executors: given a strategy, a model built in its scope, data and a reporter, train and evaluate."""

from runner.executors.base import Job, Result


def get_executor(name: str):
    if name == "fit":
        from runner.executors.fit import run_fit

        return run_fit
    from runner.executors.custom_loop import run_custom_loop

    return run_custom_loop


__all__ = ["Job", "Result", "get_executor"]
