"""The run's metrics beside its loss: the built-in accuracy of the classification losses, and train.metrics, your own.

train.metrics is a list of nodes as Hydra instantiates objects (`_target_` plus keyword arguments). A target may be
- a tf_keras `Metric` class, made with those arguments: `{_target_: tf_keras.metrics.AUC, from_logits: true}`;
- a per-example function `(y_true, y_pred, **arguments)`, averaged over the examples (tf_keras' MeanMetricWrapper),
  named by `name:` or the function's own name;
- any other function, called with the arguments, that returns one of those two.
Each is logged per split, under its name: `<name>` on the training batches (the mean since the epoch began, as
Model.fit logs its metrics), `eval/<name>` at each evaluation, and for a per-example function on one worker with
several replicas `<name>/replica_<i>`, each replica's own mean (read from the metric's per-replica copies: no
cross-device op in the step). The metrics are tf_keras' whatever the model's Keras: they only see tensors, and a
Keras 3 metric does not aggregate replicas right under every strategy.

Build them inside strategy.scope(); check_metrics runs each once on two examples before the first step.
"""

import functools
import inspect
import re

from omegaconf import DictConfig, ListConfig, OmegaConf

from runner.builders.targets import callable_at, per_example_function, probe_examples, ran_on_probe, reason
from runner.errors import ConfigError, RunnerError

KEY = "train.metrics"
KINDS = (
    "Give a tf_keras Metric class (tf_keras.metrics.AUC or your subclass), a function (y_true, y_pred, **arguments) "
    "returning one value per example, or a function that returns either."
)
# one word, not starting with '.' (MLflow refuses '.' and '..' as keys): '/' is the runner's (eval/..., loss/replica_i)
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
MAXIMISED = ("accuracy", "auc", "precision", "recall")  # early stopping's mode=auto: a name ending so is maximised
INTERNAL = {"replica_losses": "Model.fit's own per-replica losses key in this run"}  # fit's logs carry it


def specs_of(value) -> list[dict]:
    """train.metrics as plain dicts (an empty list when not set)."""
    if value is None:
        return []
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    return [dict(spec) for spec in value]


def builtin_names(loss) -> list[str]:
    """The built-in metrics beside eval/loss for the run's loss (known before TensorFlow)."""
    return ["accuracy"] if loss in ("binary_crossentropy", "sparse_categorical_crossentropy") else []


def _builtin(loss) -> list:
    """Accuracy for losses that have one (a logit above 0 or a probability above 0.5 is the positive class)."""
    import tf_keras

    from runner.builders.loss import from_logits

    if loss == "binary_crossentropy":
        return [tf_keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0 if from_logits(loss) else 0.5)]
    if loss == "sparse_categorical_crossentropy":
        return [tf_keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    return []


def build_metrics(loss, specs=None) -> list:
    """The built-in metrics for `loss`, then the user's (train.metrics): tf_keras Metric objects, made afresh."""
    return [*_builtin(loss), *build_own(specs)]


def build_own(specs) -> list:
    """train.metrics, each a tf_keras Metric: ConfigError naming the entry's key when one cannot be made."""
    return [_one(spec, f"{KEY}[{i}]") for i, spec in enumerate(specs_of(specs))]


def _one(spec: dict, key: str):
    import tf_keras

    target = spec.get("_target_")
    kwargs = {k: v for k, v in spec.items() if not k.startswith("_")}
    what = f"{key}._target_={target!r}"
    fn = callable_at(key, target, KINDS)
    if per_example_function(fn, {k: v for k, v in kwargs.items() if k != "name"}):
        name = kwargs.pop("name", None) or getattr(fn, "__name__", "metric")
        try:
            inspect.signature(fn).bind(None, None, **kwargs)
        except TypeError as err:
            raise ConfigError(
                f"{what} does not accept the arguments {sorted(kwargs)}: {reason(err)}. Change them under {key}."
            ) from None
        obj = tf_keras.metrics.MeanMetricWrapper(fn, name=str(name), **kwargs)
    else:
        name = kwargs.pop("name", None) if "name" in kwargs and not _takes(fn, "name") else None
        try:
            obj = fn(**kwargs)
        except (TypeError, ValueError) as err:
            raise ConfigError(
                f"{what} does not accept the arguments {sorted(kwargs)}: {reason(err)}. Change them under {key}."
            ) from None
        # a function made by the factory (not any callable object: a Keras loss is callable too, and no metric)
        if (inspect.isroutine(obj) or isinstance(obj, functools.partial)) and per_example_function(obj, {}):
            own = getattr(obj, "__name__", None) or getattr(getattr(obj, "func", None), "__name__", "metric")
            obj = tf_keras.metrics.MeanMetricWrapper(obj, name=str(name or own))
        elif name is not None:
            raise ConfigError(
                f"{what} does not take name={name!r} and gave {type(obj).__name__}: give the name to what makes the "
                f"metric, or leave {key}.name out (the metric's own name is then logged)."
            )
    if not isinstance(obj, tf_keras.metrics.Metric):
        keras3 = type(obj).__module__.split(".")[0] == "keras"
        why = (
            "a Keras 3 metric: the runner's metrics are tf_keras' whatever the model's Keras (they only see tensors), "
            f"so name tf_keras.metrics.{type(obj).__name__}"
            if keras3
            else f"not a metric. {KINDS}"
        )
        raise ConfigError(f"{what} gave {type(obj).__name__}, {why}.")
    return obj


def _takes(fn, arg: str) -> bool:
    """Whether `fn` accepts the keyword `arg` (or any keyword)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == arg or p.kind is p.VAR_KEYWORD for p in params)


def is_per_example(metric) -> bool:
    """A mean over examples (a per-example function wrapped): one per replica makes sense."""
    import tf_keras

    return isinstance(metric, tf_keras.metrics.MeanMetricWrapper)


def check_metrics(
    specs, loss, model, data, monitor: str | None, strategy=None, accumulation_steps: int = 1, mode: str = "auto"
) -> None:
    """train.metrics made outside any strategy and run once on two examples (the data's first two, or zeros shaped
    like them), before the first step: a name taken twice or by the runner, a function with one value per batch, or
    a metric that fails on the model's output is one paragraph here, not TensorFlow's trace inside the step.
    `monitor`: train.early_stopping.monitor when a run is watched, which must be among the evaluation's metrics."""
    specs = specs_of(specs)
    if not specs:
        return
    _check_strategy(strategy, accumulation_steps)
    import numpy as np

    taken = {"loss": "the loss", **INTERNAL, **{n: "the built-in metric" for n in builtin_names(loss)}}
    import tensorflow as tf

    x, y, real = probe_examples(data)  # real=False: zeros shaped like the data, so a failure may be theirs
    y_pred = model(x, training=False)
    shapes = f"outputs of shape {tuple(y_pred.shape)}, labels of shape {tuple(np.shape(y))}"
    for i, metric in enumerate(build_own(specs)):
        key, name = f"{KEY}[{i}]", metric.name
        if not NAME.match(name) or ".." in name:
            raise ConfigError(
                f"{key} is named {name!r}: a metric's name is one word of letters, digits and _ . - ('/' is the "
                f"runner's: eval/{name} and {name}/replica_<i> are made from it). Give it name: <word>."
            )
        if name in taken:
            raise ConfigError(
                f"{key} is named {name!r}, which {taken[name]} of this run already is: the two would be logged as one "
                f"MLflow metric. Give it another name ({key}.name=... in its node)."
            )
        taken[name] = f"{key}"
        target = specs[i].get("_target_")
        if not ran_on_probe(
            lambda metric=metric: (metric.update_state(y, y_pred), float(metric.result())),
            real,
            lambda err, key=key, target=target: (
                f"{key}._target_={target!r} failed on the model's output for two examples ({shapes}): {_said(err)}. "
                "Check its arguments (tf_keras' classification metrics take from_logits: the models output logits)."
            ),
        ):
            continue
        if is_per_example(metric) and float(metric.count.numpy()) < 2:  # two examples counted once: a batch's number
            raise ConfigError(
                f"{key}._target_={specs[i].get('_target_')!r} gave one number per batch, not one per example: the "
                "runner averages a function's values over the examples (and per replica), so a batch mean would "
                "weigh batches of different sizes alike. Return the value of each example (shape [batch])."
            )
        traced = build_own([specs[i]])[0]  # the step traces it: Python or NumPy on its tensors fails only there

        def update(labels, outputs, metric=traced):
            metric.update_state(labels, outputs)

        try:
            tf.function(update)(tf.constant(y), tf.constant(y_pred))
        except RunnerError:  # a stop (Ctrl-C, SIGTERM) or a refusal inside it: not the user's error
            raise
        except Exception as err:  # noqa: BLE001
            raise ConfigError(
                f"{key}._target_={specs[i].get('_target_')!r} works on plain values but fails inside the traced training "
                f"step: {_said(err)}. Write it with TensorFlow ops on its inputs (no .numpy(), NumPy or Python math)."
            ) from None
    evaluated = [n for n in taken if n not in INTERNAL]
    if monitor and monitor.startswith("eval/") and monitor[len("eval/") :] not in evaluated:
        raise ConfigError(
            f"train.early_stopping.monitor={monitor} is not among this run's evaluation metrics "
            f"({', '.join(f'eval/{n}' for n in evaluated)}): set it to one of them; nothing was trained."
        )
    if monitor and mode == "auto" and monitor[len("eval/") :] in taken and taken[monitor[len("eval/") :]].startswith(KEY):
        if not monitor.endswith(MAXIMISED):
            raise ConfigError(
                f"train.early_stopping.monitor={monitor} is your own metric, and train.early_stopping.mode=auto cannot "
                f"tell whether it improves upwards (auto is max only for names ending in {', '.join(MAXIMISED)}): set "
                "train.early_stopping.mode=max or min; nothing was trained."
            )


def _check_strategy(strategy, k: int) -> None:
    """CentralStorageStrategy keeps a metric's variables on the parameter device: an update from a replica is a merge,
    which TensorFlow refuses inside the accumulation's tf.while_loop (`merge_call` inside a loop)."""
    if strategy is None or k < 2:
        return
    import tensorflow as tf

    central = isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy)
    ps = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
    if (central or ps) and strategy.num_replicas_in_sync > 1:  # variables aggregated across this worker's replicas
        raise ConfigError(
            f"{KEY} with train.accumulation_steps={k} under {type(strategy).__name__} over "
            f"{strategy.num_replicas_in_sync} replicas: its metric variables live on the parameter device, so updating "
            "them from inside the accumulation's loop of micro-batches is a "
            "cross-replica merge, which TensorFlow does not allow in a loop (merge_call inside tf.while_loop). Use "
            f"strategy=mirrored (the same update), train.accumulation_steps=1, or leave {KEY} out; nothing was trained."
        )


def _said(err: Exception) -> str:
    """An op's error without TensorFlow's node and op annotations ({{function_node ...}}, [Op:...] name:)."""
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", reason(err))
    return re.sub(r"\s*\[Op:[^\]]*\](\s*name:\s*\S*)?", "", text).strip() or type(err).__name__


def results(metrics) -> dict[str, float]:
    """{name: value} of each metric since its last reset."""
    return {m.name: float(m.result()) for m in metrics}


def per_replica(strategy, metrics) -> dict[str, float]:
    """{<name>/replica_<i>: value} for the per-example metrics, where the strategy keeps one copy of each metric
    variable per replica of this process (Mirrored; not CentralStorage's one copy, not other workers' replicas)."""
    found = {}
    if strategy.num_replicas_in_sync < 2:
        return found
    import tensorflow as tf

    local = strategy.experimental_local_results
    for metric in metrics:
        if not is_per_example(metric) or metric.total.synchronization != tf.VariableSynchronization.ON_READ:
            continue  # on-write copies (TPU) all hold the global value
        totals, counts = local(metric.total), local(metric.count)
        if len(totals) != strategy.num_replicas_in_sync:
            return {}
        for i, (total, count) in enumerate(zip(totals, counts)):
            n = float(count.numpy())
            found[f"{metric.name}/replica_{i}"] = float(total.numpy()) / n if n else float("nan")
    return found


def reset(metrics) -> None:
    for metric in metrics:
        metric.reset_state()
