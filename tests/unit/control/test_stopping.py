"""A second Ctrl-C raises Stopped from the signal handler wherever the main thread is. While TensorFlow traces a
function, AutoGraph catches it and fails on the unconverted code with an error of its own: the stop behind that error
is still told as the stop (exit 130, the run KILLED), not as a traceback (runner.control.stopping.wrapped)."""

import signal

import pytest

from runner.control import stopping
from runner.errors import ConfigError


@pytest.fixture
def raised(monkeypatch):
    monkeypatch.setattr(stopping, "_raised", [])
    return stopping._raised


def test_an_error_after_the_handler_raised_is_the_stop(raised):
    raised.append(signal.SIGINT)
    told = stopping.wrapped(TypeError("Iterating over a symbolic `tf.Tensor` is not allowed"))
    assert isinstance(told, stopping.Stopped) and told.exit_code == 130 and str(told) == "stopped by SIGINT"


def test_without_a_raised_stop_an_error_is_its_own(raised):
    assert stopping.wrapped(TypeError("a bug")) is None
    raised.append(signal.SIGTERM)
    assert stopping.wrapped(ConfigError("a refusal")) is None  # the runner's own errors say what they are
