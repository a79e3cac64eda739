"""executor=fit's executor.callbacks (runner.executors.user_callbacks.build_callbacks): a user's own tf_keras callbacks,
each refused by its key when it cannot be made or is not a callback. The one that runs is end to end
(tests/e2e/test_inputs.py::test_a_users_keras_callback_runs_beside_the_runners_own)."""

import os
import sys

import pytest
from omegaconf import OmegaConf

from runner.errors import ConfigError

from helpers import ROOT

USER = str(ROOT / "tests" / "user_project")


@pytest.fixture
def user_project():
    sys.path.insert(0, USER)
    yield
    sys.path.remove(USER)


@pytest.mark.slow  # imports TensorFlow (tf_keras)
@pytest.mark.parametrize(
    "spec, said",
    [
        ({"_target_": "my_callbacks.Missing"}, "executor.callbacks[1]._target_=my_callbacks.Missing could not be made"),
        ({"_target_": "my_callbacks.NotACallback"}, "returned NotACallback, not a tf_keras.callbacks.Callback"),
        ({"_target_": "my_callbacks.EpochLog"}, "executor.callbacks[1]._target_=my_callbacks.EpochLog could not be made"),
        ({"path": "x"}, "executor.callbacks[1]={'path': 'x'} has no _target_"),
    ],
)
def test_a_callback_that_cannot_be_made_or_is_not_one_is_named_by_its_key(user_project, spec, said):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    from runner.executors.user_callbacks import build_callbacks

    good = {"_target_": "my_callbacks.EpochLog", "path": "epochs.jsonl"}
    assert type(build_callbacks(OmegaConf.create([good]))[0]).__name__ == "EpochLog"
    with pytest.raises(ConfigError) as err:
        build_callbacks(OmegaConf.create([good, spec]))
    assert said in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow  # imports TensorFlow (both Keras)
def test_a_keras3_model_takes_keras3_callbacks_and_refuses_tf_keras_ones(user_project):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import keras

    from runner.executors.user_callbacks import build_callbacks

    made = build_callbacks(OmegaConf.create([{"_target_": "my_keras3_callbacks.EpochLog", "path": "e.jsonl"}]), keras)
    assert isinstance(made[0], keras.callbacks.Callback)
    with pytest.raises(ConfigError) as err:
        build_callbacks(OmegaConf.create([{"_target_": "my_callbacks.EpochLog", "path": "e.jsonl"}]), keras)
    said = str(err.value)
    assert "returned EpochLog, not a keras.callbacks.Callback" in said and "Keras 3" in said and "\n" not in said


@pytest.mark.slow  # imports TensorFlow (tf_keras)
def test_a_stop_while_a_callback_is_made_is_the_stop_not_a_bad_callback(user_project, tmp_path, monkeypatch):
    """Hydra's instantiate wraps what a _target_ raises; Ctrl-C landing in the callback's module import is the run's
    stop (130, KILLED), not "could not be made" (exit 2)."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    from runner.control.stopping import Stopped
    from runner.executors.user_callbacks import build_callbacks

    (tmp_path / "slow_callbacks.py").write_text(
        "import signal\nfrom runner.control.stopping import Stopped\nraise Stopped(signal.SIGINT, 'stopped by SIGINT')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(Stopped):
        build_callbacks(OmegaConf.create([{"_target_": "slow_callbacks.Hook"}]))
