"""runner/builders/own_code.py: an error raised in the user's own code during training is told from the error
itself (a frame in a `_target_`'s file, or TensorFlow's `File "...", line N` note naming it) and said in one
paragraph; the runner's own errors and a library's are left alone. In process, no TensorFlow."""

import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from runner.builders import own_code
from runner.errors import ConfigError, UserCodeError

USER_MODULE = textwrap.dedent(
    """
    def hook():
        helper()


    def helper():
        raise KeyError("epoch")


    def leave():
        import sys

        sys.exit(0)
    """
)


def _cfg(**train):
    return OmegaConf.create(
        {
            "model": {"_target_": "runner.models.mlp"},
            "data": {"name": "synthetic"},
            "train": {"loss": "auto", "metrics": None, "optimizer": {"_target_": None, "schedule": {"_target_": None}}, **train},
            "executor": {"callbacks": [{"_target_": "user_hooks.hook"}]},
        }
    )


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "user_hooks.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_hooks", raising=False)  # another test's copy, in its own directory
    return tmp_path / "user_hooks.py"


def test_an_error_raised_in_a_targets_file_is_named_by_its_key_and_line(user_module):
    import user_hooks

    try:
        user_hooks.hook()
    except KeyError as err:
        told = own_code.raised(err, _cfg(), step=12, output_dir="/out", checkpoint_dir=None)
    assert isinstance(told, UserCodeError) and told.exit_code == 6
    text = str(told)
    assert text.startswith("executor.callbacks[0]._target_='user_hooks.hook' raised during training (after step 12): ")
    assert f"KeyError: 'epoch' ({user_module.resolve()}, line 7)" in text  # helper's raise: the innermost place
    assert "no checkpoint was written" in text and text.endswith("python -m runner resume=/out.")


def test_tensorflows_note_naming_the_file_is_enough(user_module):
    err = ValueError(f'in user code:\n\n    File "{user_module}", line 3, in hook  *\n        helper()\n\n    KeyError: boom\n')
    text = str(own_code.raised(err, _cfg()))
    assert "raised during training: KeyError: boom (" in text and ", line 3)" in text


def test_the_runners_errors_and_libraries_errors_are_left_to_the_others(user_module):
    assert own_code.raised(ConfigError("refused"), _cfg()) is None
    try:
        OmegaConf.create("[unclosed")  # raised in an installed library's files
    except Exception as err:  # noqa: BLE001
        assert own_code.raised(err, _cfg()) is None
    builtin = _cfg(metrics=[{"_target_": "omegaconf.OmegaConf.create"}])  # a library's target is not the user's
    keys = [key for entries in own_code.own_files(builtin).values() for key, _, _ in entries]
    assert keys == ["executor.callbacks[0]"]


def test_no_gradient_through_the_users_loss_names_the_loss(user_module):
    cfg = _cfg(loss={"_target_": "user_hooks.helper"})
    err = ValueError("No gradients provided for any variable: (['dense/kernel:0'],)")
    text = str(own_code.raised(err, cfg, step=1))
    assert text.startswith("train.loss._target_='user_hooks.helper': TensorFlow found no gradient")
    assert own_code.raised(err, OmegaConf.merge(cfg, {"train": {"loss": "auto"}, "model": {"_target_": "x"}})) is None


def test_the_errors_own_line_is_the_last_one_tensorflow_quotes():
    err = ValueError('in user code:\n  File "a.py", line 2\n  tf.errors.InvalidArgumentError: outer\n  RuntimeError: inner')
    assert own_code.error_line(err) == "RuntimeError: inner"
    assert own_code.error_line(KeyError("k")) == "KeyError: 'k'"


def test_sys_exit_in_the_users_code_mid_training_is_not_a_finished_run(user_module):
    import user_hooks

    try:
        user_hooks.leave()
    except SystemExit as err:
        told = own_code.raised(err, _cfg(), step=3)
    assert "raised during training (after step 3): it called sys.exit(0) (" in str(told) and told.exit_code == 6
    assert own_code.raised(KeyboardInterrupt(), _cfg()) is None  # Ctrl-C is the stop's, not the user's error


def test_one_file_of_several_targets_names_the_one_whose_code_raised(user_module):
    """A project's model, loss and callbacks in one file: the key whose function holds the line, not the first."""
    import user_hooks

    cfg = _cfg(loss={"_target_": "user_hooks.leave"})
    cfg.model._target_ = "user_hooks.hook"
    cfg.executor.callbacks[0]._target_ = "user_hooks.helper"
    try:
        user_hooks.hook()
    except KeyError as err:
        text = str(own_code.raised(err, cfg, step=2))
    assert text.startswith("executor.callbacks[0]._target_='user_hooks.helper' raised during training (after step 2)")


def test_where_tensorflow_made_an_op_is_not_where_the_users_code_failed(user_module):
    """A graph error's "Detected at node ... defined at" trace names where an op was made (the user's model), and
    an out-of-memory error is the machine's: neither is blamed on the user's code."""
    oom = type("ResourceExhaustedError", (Exception,), {})(
        f'Graph execution error:\n\nDetected at node dense/MatMul defined at (most recent call last):\n  File "{user_module}", '
        "line 3, in hook\n\nOOM when allocating tensor"
    )
    assert own_code.raised(oom, _cfg()) is None
    noted = ValueError(f'Graph execution error:\n\nDetected at node x defined at:\n  File "{user_module}", line 3\n')
    assert own_code.raised(noted, _cfg()) is None


def test_before_the_first_step_nothing_was_trained_and_a_wrapped_stop_is_the_stops(user_module):
    import signal

    import user_hooks

    from runner.control.stopping import Stopped

    try:
        user_hooks.hook()
    except KeyError as err:
        told = own_code.raised(err, _cfg(), trained=False)
    text = str(told)
    assert "raised before the first training step: KeyError: 'epoch'" in text and text.endswith(
        "Nothing was trained; fix it and run again."
    )
    assert told.trained_nothing  # refused before the first step: its run is deleted, as other refusals' are
    try:
        try:
            raise Stopped(signal.SIGINT, "stopped by SIGINT")
        except Stopped as stop:
            raise RuntimeError("my code caught the stop") from stop
    except RuntimeError as wrapped:
        assert own_code.raised(wrapped, _cfg()) is None
