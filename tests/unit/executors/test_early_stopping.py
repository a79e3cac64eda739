"""train.early_stopping and checkpoint.keep_best's decisions (runner.executors.early_stopping.Watch), without
TensorFlow; the runs that stop early and restore the best checkpoint are in tests/e2e/test_recipes.py."""

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from runner.config import validate
from runner.errors import ConfigError
from runner.executors.early_stopping import Watch, direction

from helpers import composed


def test_the_direction_follows_the_metric_unless_given():
    assert direction("eval/loss", "auto") == "min" and direction("eval/accuracy", "auto") == "max"
    assert direction("eval/accuracy", "min") == "min" and direction("eval/loss", "max") == "max"


def test_patience_counts_evaluations_since_the_best_and_min_delta_is_no_improvement():
    watch = Watch(monitor="eval/loss", patience=2, min_delta=0.1)
    seen = [watch.update({"eval/loss": v}, step) for step, v in [(1, 1.0), (2, 0.95), (3, 0.8), (4, 0.75), (5, 0.72)]]
    assert seen == [(True, False), (False, False), (True, False), (False, False), (False, True)]
    assert (watch.best, watch.best_step, watch.since) == (0.8, 3, 2)
    assert watch.metrics() == {"best/eval/loss": 0.8, "best/step": 3.0}


def test_nan_and_inf_never_improve():
    watch = Watch(monitor="eval/loss", patience=3)
    assert watch.update({"eval/loss": math.nan}, 1) == (False, False) and watch.best is None and watch.metrics() == {}
    assert watch.update({"eval/loss": 2.0}, 2) == (True, False)
    assert watch.update({"eval/loss": -math.inf}, 3) == (False, False)


@given(
    values=st.lists(st.floats(-10, 10) | st.just(math.nan), min_size=1, max_size=30),
    patience=st.integers(1, 5),
    maximise=st.booleans(),
)
def test_each_evaluation_is_a_best_when_it_beats_all_before_and_a_stop_patience_after_the_last_best(values, patience, maximise):
    watch = Watch(monitor="eval/accuracy", mode="max" if maximise else "min", patience=patience)
    best, last_best = None, -1  # by index: the evaluations since the last best are i - last_best
    for i, v in enumerate(values):
        beats = math.isfinite(v) and (best is None or (v > best if maximise else v < best))
        if beats:
            best, last_best = v, i
        assert watch.update({"eval/accuracy": v}, i) == (beats, i - last_best >= patience)
    assert watch.best == best and watch.best_step == (last_best if best is not None else None)


def test_the_state_outlives_the_process_for_a_resume_and_a_new_monitor_starts_afresh(tmp_path):
    first = Watch(monitor="eval/loss", patience=3, state_dir=str(tmp_path))
    first.update({"eval/loss": 1.0}, 8)
    first.update({"eval/loss": 1.5}, 16)
    first.save()  # after_epoch saves once the best checkpoint is written
    again = Watch(monitor="eval/loss", patience=3, state_dir=str(tmp_path))
    assert (again.best, again.best_step, again.since) == (1.0, 8, 1)
    other = Watch(monitor="eval/accuracy", patience=3, state_dir=str(tmp_path))
    assert other.best is None
    quiet = Watch(monitor="eval/loss", state_dir=str(tmp_path / "w1"), writes=False)  # a worker that is not the chief
    quiet.update({"eval/loss": 1.0}, 1)
    quiet.save()
    assert not (tmp_path / "w1").exists()


def test_a_step_evaluated_again_replaces_its_earlier_evaluation():
    """A recovery or a resume goes back before an epoch end it had evaluated: that epoch counts once."""
    watch = Watch(monitor="eval/loss", patience=2)
    for step, value in [(10, 0.9), (20, 0.8), (30, 0.85)]:
        watch.update({"eval/loss": value}, step)
    assert watch.since == 1
    assert watch.update({"eval/loss": 0.95}, 20) == (False, False)  # back to 15, then 20 again: 10 is the best now
    assert watch.evaluations == [(10, 0.9), (20, 0.95)] and (watch.best_step, watch.since) == (10, 1)
    assert watch.update({"eval/loss": 0.5}, 30) == (True, False)


def test_a_damaged_state_file_is_a_warning_and_a_fresh_count(tmp_path, caplog):
    (tmp_path / "best.json").write_text('{"monitor": "eval/loss", "best": ')
    watch = Watch(monitor="eval/loss", patience=1, state_dir=str(tmp_path))
    assert watch.best is None and "could not be read" in caplog.text
    watch.update({"eval/loss": 3.0}, 1)
    watch.save()
    assert json.loads((tmp_path / "best.json").read_text())["best"] == 3.0


def test_a_metric_the_evaluation_lacks_is_named_with_the_ones_it_has():
    with pytest.raises(ConfigError, match=r"monitor=eval/accuracy is not among .*\(eval/loss\)"):
        Watch(monitor="eval/accuracy", patience=1).update({"eval/loss": 1.0}, 1)


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["checkpoint.restore_best=true"], "add checkpoint.keep_best=true"),
        (["checkpoint.keep_best=true", "checkpoint.enabled=false"], "checkpoint.enabled=false writes none"),
        (["train.early_stopping.monitor=eval/acc"], "train.early_stopping.monitor"),
        (["train.early_stopping.mode=lowest"], "train.early_stopping.mode"),
        (["train.early_stopping.patience=0"], "train.early_stopping.patience"),
    ],
)
def test_bad_settings_are_refused_before_tensorflow(overrides, said):
    with pytest.raises(ConfigError) as err:
        validate.check_config(composed(*overrides))
    assert said in str(err.value) and "\n" not in str(err.value)


def test_nothing_is_watched_by_default():
    from runner.executors.early_stopping import watch_for

    cfg = composed()
    assert watch_for(cfg.train, cfg.checkpoint, None, writes=True) is None
    cfg = composed("checkpoint.keep_best=true")
    assert watch_for(cfg.train, cfg.checkpoint, None, writes=True).keep_best
    assert OmegaConf.select(cfg, "train.early_stopping.patience") is None


def test_a_monitor_the_loss_cannot_give_is_refused_before_the_first_step():
    """eval/accuracy watched with a regression loss: refused when the run's Watch is made, not after its first epoch."""
    from runner.executors.early_stopping import watch_for

    cfg = composed("train.early_stopping.patience=2", "train.early_stopping.monitor=eval/accuracy")
    with pytest.raises(ConfigError) as err:
        watch_for(cfg.train, cfg.checkpoint, None, writes=True, loss="mse")
    message = str(err.value)
    assert message.startswith("train.early_stopping.monitor=eval/accuracy (watched for train.early_stopping.patience)")
    assert "(eval/loss): its loss is mse" in message and "monitor=eval/loss; nothing was trained." in message
    assert watch_for(cfg.train, cfg.checkpoint, None, writes=True, loss="sparse_categorical_crossentropy").monitor == (
        "eval/accuracy"
    )
    cfg = composed("checkpoint.keep_best=true", "train.early_stopping.monitor=eval/accuracy")
    with pytest.raises(ConfigError, match=r"\(watched for checkpoint.keep_best\)"):
        watch_for(cfg.train, cfg.checkpoint, None, writes=True, loss="mse")
