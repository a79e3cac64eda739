"""train.steps_per_execution / steps_per_loop: auto ends a call at every checkpoint and epoch end, and at every logged step
unless the executor logs the steps inside a call after it."""

import pytest

from runner.executors.per_call import AUTO_STEPS_CAP, steps_per_call, text


def auto(log_every=10, spe=1000, ckpt=None, ps=False, inside=False):
    return steps_per_call(
        "auto", log_every=log_every, steps_per_epoch=spe, checkpoint_every=ckpt, parameter_server=ps, logs_inside=inside
    )


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, 10),  # the logging cadence
        ({"inside": True}, AUTO_STEPS_CAP),  # unless the executor hands back every step's loss (the custom loop)
        ({"log_every": 1000}, AUTO_STEPS_CAP),  # a stop request waits at most the cap
        ({"spe": 4}, 2),  # no call crosses an epoch, and each epoch has two calls or more (the first is warm-up)
        ({"spe": 2}, 1),
        ({"spe": 1}, 1),
        ({"ckpt": 3}, 3),  # nor a checkpoint
        ({"log_every": 1}, 1),
        ({"ps": True}, 1),  # a closure per step: the coordinator balances workers by closures
    ],
)
def test_auto(kwargs, expected):
    assert auto(**kwargs) == expected


@pytest.mark.parametrize(
    "spe, log_every, expected",
    [(64, 10, 2), (3000, 10, 10), (200, 1000, 100), (100, 1000, 50), (600, 1000, 100), (7, 10, 1), (30, 45, 15)],
)
def test_whole_calls_divide_the_epoch_and_the_logging(spe, log_every, expected):
    n = steps_per_call(
        "auto", log_every=log_every, steps_per_epoch=spe, checkpoint_every=None, parameter_server=False, whole=True
    )
    assert n == expected and spe % n == 0 and log_every % n == 0


def test_a_number_wins():
    assert steps_per_call(7, log_every=10, steps_per_epoch=3, checkpoint_every=2, parameter_server=True) == 7
    assert text("auto", 10) == "10 per tf.function call, auto" and text(7, 7) == "7 per tf.function call"
