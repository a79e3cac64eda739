"""train.optimizer -> a Keras optimizer (the model's Keras: tf_keras, or Keras 3), with decoupled weight decay and a
learning-rate schedule over the global step: a built-in (train.optimizer.name), or your own by train.optimizer._target_,
which gets the same learning rate, schedule, clipnorm and weight decay.

The schedule is a function of the optimizer's own step counter (`optimizer.iterations`, which checkpoints restore),
so a resumed run goes on from the same learning rate (with the same train.epochs, or decay_steps given).
`learning_rate(cfg, step)` computes the same value in plain Python for the `train/learning_rate` metric, without a
TensorFlow call per log line.
"""

import inspect
import math
from enum import StrEnum


class Optimizer(StrEnum):
    """train.optimizer.name (typed by it in runner.config.schema)."""

    sgd = "sgd"
    adam = "adam"
    adamw = "adamw"  # Adam with decoupled weight decay (Loshchilov and Hutter); weight_decay default 0.004, Keras'
    rmsprop = "rmsprop"
    adagrad = "adagrad"


class Schedule(StrEnum):
    """train.optimizer.schedule.name: what follows the linear warm-up (warmup_steps, from 0 to learning_rate)."""

    constant = "constant"
    cosine = "cosine"  # half a cosine from learning_rate down to final_fraction x learning_rate over decay_steps
    linear = "linear"  # a straight line over the same span


CURRENT_RATE = "current_learning_rate"  # the variable tf_keras keeps a schedule's rate in


def total_decay_steps(cfg, total_steps: int) -> int:
    """The decay's length: schedule.decay_steps, else what the run has left after the warm-up (at least 1)."""
    schedule = cfg.schedule
    if schedule.decay_steps is not None:
        return schedule.decay_steps
    return max(1, total_steps - schedule.warmup_steps)


def learning_rate(cfg, step: int, total_steps: int) -> float:
    """The learning rate at global step `step` (0 before the first update), as the optimizer applies it."""
    peak, schedule = cfg.learning_rate, cfg.schedule
    warmup = schedule.warmup_steps
    if step < warmup:
        return peak * step / warmup
    if schedule.name == Schedule.constant:
        return peak
    done = min(1.0, (step - warmup) / total_decay_steps(cfg, total_steps))
    fall = 0.5 * (1 + math.cos(math.pi * done)) if schedule.name == Schedule.cosine else 1 - done
    return peak * (schedule.final_fraction + (1 - schedule.final_fraction) * fall)


def constant(cfg) -> bool:
    """No schedule: the plain learning rate, no warm-up."""
    return cfg.schedule.name == Schedule.constant and not cfg.schedule.warmup_steps and not own_schedule(cfg)


def own_schedule(cfg) -> bool:
    """train.optimizer.schedule._target_ is set: the user's LearningRateSchedule."""
    return bool(cfg.schedule.get("_target_"))


def scheduled(cfg, total_steps: int, keras=None):
    """step -> learning rate for the train/learning_rate metric, or None when the rate is constant. A user's schedule
    is a second instance of it, called at the logged steps (a TensorFlow op per log line, not per step)."""
    if constant(cfg):
        return None
    if own_schedule(cfg):
        schedule = _user_schedule(cfg.schedule, keras)
        return lambda step: float(schedule(step))
    return lambda step: learning_rate(cfg, step, total_steps)


def _rate(cfg, total_steps: int, keras):
    """A float, or a schedule: Keras' own where one computes `learning_rate` (so that a model.keras saved with its
    optimizer loads anywhere), runner.builders.lr_schedule's for a linear decay after a warm-up."""
    schedule = cfg.schedule
    peak, warmup, final = cfg.learning_rate, schedule.warmup_steps, schedule.final_fraction
    if constant(cfg):
        return peak  # as before schedules existed: checkpoints and saved models unchanged
    if own_schedule(cfg):
        return _user_schedule(schedule, keras)
    decay = total_decay_steps(cfg, total_steps)
    if schedule.name == Schedule.linear and not warmup:
        return keras.optimizers.schedules.PolynomialDecay(peak, decay, end_learning_rate=peak * final, power=1.0)
    if schedule.name == Schedule.linear:
        from runner.builders import lr_schedule

        if keras.__name__ == "keras":
            return lr_schedule.keras3_warmup_linear(peak, warmup, decay, final)
        return lr_schedule.WarmupLinear(peak, warmup, decay, final)
    # cosine, or constant after a warm-up (a cosine that ends where it starts)
    alpha = 1.0 if schedule.name == Schedule.constant else final
    if not warmup:
        return keras.optimizers.schedules.CosineDecay(peak, decay, alpha=alpha)
    return keras.optimizers.schedules.CosineDecay(0.0, decay, alpha=alpha, warmup_target=peak, warmup_steps=warmup)


def build_optimizer(cfg, mixed_precision: bool = False, total_steps: int = 1, keras=None):
    """The optimizer of train.optimizer, of `keras` (the model's Keras module; tf_keras when not given);
    `total_steps` (the run's epochs x steps per epoch) sets where a schedule without decay_steps ends."""
    import tensorflow as tf

    if keras is None:
        import tf_keras as keras

    def first_replica_rate(next_creator, **kwargs):
        # tf_keras assigns a schedule's current rate in replica context (apply_gradients); without an aggregation,
        # CentralStorageStrategy's variables refuse that ("You must specify an aggregation method"). Every replica
        # computes the same rate, so the first replica's is the value.
        if kwargs.get("name") == CURRENT_RATE:
            kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
        return next_creator(**kwargs)

    with tf.variable_creator_scope(first_replica_rate):
        optimizer = _optimizer(cfg, total_steps, keras)
    if mixed_precision:  # float16 gradients underflow without loss scaling
        import tf_keras

        optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def _optimizer(cfg, total_steps: int, keras):
    opt = keras.optimizers
    kwargs = {"learning_rate": _rate(cfg, total_steps, keras)}
    if cfg.clipnorm is not None:
        kwargs["clipnorm"] = cfg.clipnorm
    if cfg.weight_decay is not None:
        kwargs["weight_decay"] = cfg.weight_decay
    if cfg.get("_target_"):
        from omegaconf import OmegaConf

        own = OmegaConf.to_container(cfg.kwargs, resolve=True) if cfg.get("kwargs") else {}
        return _user_optimizer(cfg._target_, {**own, **kwargs}, keras)
    if cfg.name == Optimizer.sgd:
        return opt.SGD(momentum=cfg.momentum, **kwargs)
    if cfg.name == Optimizer.rmsprop:
        return opt.RMSprop(momentum=cfg.momentum, **kwargs)
    return {Optimizer.adam: opt.Adam, Optimizer.adamw: opt.AdamW, Optimizer.adagrad: opt.Adagrad}[cfg.name](**kwargs)


def _user_optimizer(target: str, kwargs: dict, keras):
    """train.optimizer._target_: a Keras optimizer class of the model's Keras, or a function that returns one."""
    from runner.builders.targets import callable_at, reason
    from runner.errors import ConfigError

    what = f"train.optimizer._target_={target!r}"
    fn = callable_at(
        "train.optimizer",
        target,
        f"Give the dotted path of a Keras optimizer class ({keras.__name__}.optimizers.Lion, or your subclass), or a "
        "built-in: train.optimizer.name=adamw.",
    )
    if inspect.isclass(fn) and not issubclass(fn, keras.optimizers.Optimizer):
        _wrong_kind(what, fn, keras)
    try:
        optimizer = fn(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"{what} does not accept the arguments {sorted(kwargs)}: {reason(err)}. The runner passes learning_rate "
            "(and clipnorm, weight_decay where set); give the others under train.optimizer.kwargs."
        ) from None
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        _wrong_kind(what, type(optimizer), keras)
    return optimizer


SCHEDULE_KINDS = (
    "Give a LearningRateSchedule class of the model's Keras ({keras}.optimizers.schedules.ExponentialDecay, or your "
    "subclass) with its arguments under train.optimizer.schedule.kwargs, or a function that returns one; or a "
    "built-in: train.optimizer.schedule.name=cosine."
)


def _user_schedule(cfg, keras=None):
    """train.optimizer.schedule._target_, made with its kwargs, checked to be a LearningRateSchedule of `keras` that
    gives a finite rate at step 0 (ConfigError otherwise: before the first step)."""
    import math

    from omegaconf import OmegaConf

    from runner.builders.targets import callable_at, reason
    from runner.errors import ConfigError, RunnerError

    if keras is None:
        import tf_keras as keras
    what, kinds = f"train.optimizer.schedule._target_={cfg._target_!r}", SCHEDULE_KINDS.format(keras=keras.__name__)
    fn = callable_at("train.optimizer.schedule", cfg._target_, kinds)
    kwargs = OmegaConf.to_container(cfg.kwargs, resolve=True) if cfg.get("kwargs") else {}
    try:
        schedule = fn(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"{what} does not accept the arguments {sorted(kwargs)}: {reason(err)}. Give its arguments under "
            "train.optimizer.schedule.kwargs (the runner passes none of its own)."
        ) from None
    base = keras.optimizers.schedules.LearningRateSchedule
    if not isinstance(schedule, base):
        other = "tf_keras" if keras.__name__ == "keras" else "keras"
        theirs = f", a schedule of {other}," if isinstance(schedule, _other_base(other)) else ""
        raise ConfigError(
            f"{what} gave {type(schedule).__module__}.{type(schedule).__name__}{theirs} not a {keras.__name__} "
            f"LearningRateSchedule, which the model's optimizer ({keras.__name__}) needs. {kinds}"
        )
    import tensorflow as tf

    try:
        first = float(schedule(0))
    except RunnerError:  # a stop (Ctrl-C, SIGTERM) or a refusal inside it: not the user's error
        raise
    except Exception as err:  # noqa: BLE001  (the user's schedule at step 0: said in one line)
        raise ConfigError(f"{what} failed at step 0: {reason(err)}. Check train.optimizer.schedule.kwargs.") from None
    try:  # the optimizer calls it inside the traced step, where Python or NumPy on the step fails
        tf.function(schedule)(tf.constant(0, tf.int64))
    except RunnerError:  # a stop (Ctrl-C, SIGTERM) or a refusal inside it: not the user's error
        raise
    except Exception as err:  # noqa: BLE001
        raise ConfigError(
            f"{what} works on a plain step but fails inside the traced training step: {reason(err)}. Write it with "
            "TensorFlow ops on its step (no .numpy(), NumPy or Python math)."
        ) from None
    if not math.isfinite(first) or first < 0:
        raise ConfigError(f"{what} gives a learning rate of {first} at step 0: it must be finite and not negative.")
    return schedule


def _other_base(name: str):
    import importlib

    return importlib.import_module(name).optimizers.schedules.LearningRateSchedule


def _wrong_kind(what: str, kind: type, keras):
    from runner.errors import ConfigError

    other = "tf_keras" if keras.__name__ == "keras" else "keras"
    raise ConfigError(
        f"{what} gives {kind.__module__}.{kind.__name__}, not a {keras.__name__} optimizer, "
        f"which the model ({keras.__name__}) needs (a legacy optimizer, or one of {other}, cannot update its "
        f"variables). Use a {keras.__name__}.optimizers.Optimizer."
    )
