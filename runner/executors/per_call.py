"""How many training steps one tf.function call runs: train.steps_per_execution (fit) and train.steps_per_loop
(custom loop), `auto` by default.

Each call costs host work whatever it runs (Python, argument matching, the graph's dispatch, a loss read back), so
a small model spends most of its step there at one step per call. `auto` runs as many steps per call as keep what
a run records exact: a call ends at every checkpoint (checkpoint.every_n_steps) and at the epoch's end, and at
every logged step (train.log_every_n_steps) unless the executor hands back each step's values (`logs_inside`: the
custom loop returns every step's losses and logs the steps inside a call after it). It runs at most AUTO_STEPS_CAP
steps, so that a stop request (Ctrl-C, SIGTERM, a preemption notice) is acted on within that many steps, and at most
half an epoch, so that every epoch has a call after the first one to time (the first is warm-up: tracing). The
choice depends on the config alone, so every worker of a multi-worker run makes the same one. Under
parameter_server a call is one worker's scheduled closure: auto keeps one step each, as the coordinator balances
steps over workers by closures. Keras 3's fit runs whole calls only (an epoch of 64 steps at 10 per call would run
70), so there auto takes a common divisor of the logging cadence and the epoch. A number wins.
"""

import math

AUTO = "auto"
AUTO_STEPS_CAP = 100


def steps_per_call(
    value,
    *,
    log_every: int,
    steps_per_epoch: int,
    checkpoint_every: int | None,
    parameter_server: bool,
    whole: bool = False,
    logs_inside: bool = False,
) -> int:
    """The steps per call for `value` (a positive int, or "auto"). `whole`: every call runs all its steps (Keras 3's
    fit), so the count must divide the epoch and the logging cadence. `logs_inside`: the logged steps need not end
    a call (their values come back with it)."""
    if value != AUTO:
        return int(value)
    if parameter_server:
        return 1
    bounds = (steps_per_epoch if logs_inside else log_every, steps_per_epoch, checkpoint_every or steps_per_epoch)
    # two calls an epoch at least: the first one's time is warm-up (tracing), so a rate needs a second
    most = min(AUTO_STEPS_CAP, max(1, steps_per_epoch // 2))
    if whole:
        common = math.gcd(*bounds)
        return max(d for d in range(1, min(common, most) + 1) if common % d == 0)
    return max(1, min(most, *bounds))


def text(value, n: int) -> str:
    """'10 per tf.function call, auto' or '4 per tf.function call'."""
    return f"{n} per tf.function call" + (", auto" if value == AUTO else "")


def of(job, value, whole: bool = False, logs_inside: bool = False) -> int:
    """steps_per_call for a Job (runner.executors.base.Job) and its train.steps_per_execution or steps_per_loop."""
    return steps_per_call(
        value,
        log_every=job.train.log_every_n_steps,
        steps_per_epoch=job.data.steps_per_epoch,
        checkpoint_every=job.checkpoint_every,
        parameter_server=job.parameter_server,
        whole=whole,
        logs_inside=logs_inside,
    )
