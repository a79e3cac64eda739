"""data=function -> your own data, from a function named by `data._target_` (as a model is: `model._target_`).

The function takes `data.kwargs` as keyword arguments and returns one of:
- NumPy arrays: a dict with `x_train`, `y_train` and optionally `x_eval`, `y_eval` (else data.eval_fraction of the
  training arrays is held out), or a tuple of two or four arrays in that order. They are checked as data=npz's
  are, and fed through the in-memory pipeline, so every data.input path works.
- a `tf.data.Dataset`, when the function has an `input_context` parameter: the guide's dataset_fn for
  `distribute_datasets_from_function`. It is called with the `tf.distribute.InputContext` of each input pipeline
  (shard by it), and, where it has those parameters, `split` ("train" or "eval"), `batch_size` (this pipeline's
  per-replica batch) and `global_batch_size`. It yields (x, y) batches; the training split is repeated here, the
  eval split must end. Every data.input path but numpy works.
The module part of `_target_` is looked up before TensorFlow starts; the function is called once training starts,
and what it returns is checked before the first step (exit 2 with one paragraph, naming the key).
"""

import inspect
import math
import os
import traceback
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import MISSING, OmegaConf

from runner.builders.data.pipeline import DataConfig, StreamedData, array_data, finish
from runner.config.fields import UINT32_MAX, choice, ranged
from runner.config.registry import register
from runner.errors import ConfigError, RunnerError


class FunctionTask(StrEnum):
    auto = "auto"  # integer labels: classification; float labels: regression
    classification = "classification"
    regression = "regression"


@dataclass
class FunctionDataConfig(DataConfig):
    _target_: str = MISSING  # the dotted path of your function: my_package.module.function
    kwargs: dict[str, Any] = field(default_factory=dict)  # its keyword arguments (+data.kwargs.<name>=... adds one)
    # auto: classification for integer labels, else regression
    task: str = choice(FunctionTask, "auto")
    # classification: the number of classes
    num_classes: int | None = ranged(None, ge=2, null="the labels' largest value + 1 (arrays only)")
    # training examples the function's dataset holds (it cannot be counted without reading it)
    train_examples: int | None = ranged(None, ge=1, null="train.steps_per_epoch sets the steps (a dataset)")
    eval_fraction: float = ranged(0.2, gt=0, lt=1)  # arrays without x_eval, y_eval: the share held out for eval
    seed: int = ranged(0, ge=0, le=UINT32_MAX)  # which examples data.eval_fraction holds out


WHERE = "data._target_"


def _function(cfg):
    import importlib

    module, _, name = str(cfg._target_).rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name, None) if module else None
    except RunnerError:  # a stop (Ctrl-C, SIGTERM) or a refusal inside it: not the user's error
        raise
    except Exception as err:  # the user's module itself fails to import
        raise ConfigError(
            f"{WHERE}={cfg._target_!r}: importing {module} failed ({type(err).__name__}: {str(err).splitlines()[0]})."
        ) from None
    if not callable(fn):
        raise ConfigError(
            f"{WHERE}={cfg._target_!r}: {module or cfg._target_!r} has no function {name!r}. Name a function as "
            "module.function, with its package on the Python path (PYTHONPATH=. when it is in the current directory)."
        )
    return fn


def _params(fn) -> dict:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def _kwargs(cfg) -> dict:
    given = cfg.kwargs or {}
    return OmegaConf.to_container(given, resolve=True) if OmegaConf.is_config(given) else dict(given)


def _call(cfg, fn, **given):
    """fn(**data.kwargs, **given) (given only where fn takes it), errors named by the key."""
    params = _params(fn)
    anything = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs = {**_kwargs(cfg), **{k: v for k, v in given.items() if anything or k in params}}
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as err:
        raise ConfigError(f"{WHERE}={cfg._target_!r} does not take data.kwargs {sorted(_kwargs(cfg))}: {err}") from None
    except ValueError:  # no signature to read (a builtin): the call says
        pass
    try:
        return fn(**kwargs)
    except RunnerError:  # a stop (Ctrl-C, SIGTERM) or a refusal inside it: not the user's error
        raise
    except Exception as err:  # the user's own code failed: where, and what it said, in one line
        frame = traceback.extract_tb(err.__traceback__)[-1]
        said = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ConfigError(
            f"{WHERE}={cfg._target_!r} raised {type(err).__name__}{f': {said}' if said else ''} (at "
            f"{os.path.basename(frame.filename)}:{frame.lineno}, in {frame.name}). Nothing was trained; fix the function."
        ) from None


@dataclass
class FunctionSource:
    """A dataset function, and what the model needs from it (found from the first training batch's spec)."""

    fn: Any
    target: str
    kwargs: dict
    input_shape: tuple
    num_outputs: int
    task: str
    num_classes: int | None
    train_examples: int | None
    streamed = True  # runner.builders.data.pipeline: its own pipeline, not the in-memory one


def _arrays(cfg, out):
    """The function's NumPy arrays as an ArrayData, checked as data=npz's are."""
    import numpy as np

    from runner.sources import checks
    from runner.sources.in_memory import ArrayData, split

    keys = ("x_train", "y_train", "x_eval", "y_eval")
    if isinstance(out, dict):
        unknown = sorted(set(out) - set(keys))
        if unknown or not {"x_train", "y_train"} <= set(out) or ("x_eval" in out) != ("y_eval" in out):
            raise ConfigError(
                f"{WHERE}={cfg._target_!r} returned a dict with keys {sorted(out)}; return x_train and y_train, and "
                "x_eval with y_eval or neither."
            )
        arrays = [out[k] for k in keys if k in out]
    elif isinstance(out, tuple | list) and len(out) in (2, 4):
        arrays = list(out)
    else:
        raise ConfigError(
            f"{WHERE}={cfg._target_!r} returned {type(out).__name__}; return NumPy arrays (a dict with x_train, "
            "y_train[, x_eval, y_eval], or a tuple of 2 or 4), or take an `input_context` and return a tf.data.Dataset."
        )
    where = f"{WHERE}={cfg._target_!r}"
    for name, a in zip(keys, arrays):
        checks.check_array(a, name, where, features=name.startswith("x"))
    x, y = arrays[0], arrays[1]
    checks.check_pair(x, y, "x_train", "y_train", where)
    if len(arrays) == 4:
        checks.check_pair(arrays[2], arrays[3], "x_eval", "y_eval", where)
    splits = arrays if len(arrays) == 4 else split(x, y, cfg.eval_fraction, cfg.seed)
    task = cfg.task if cfg.task != "auto" else ("classification" if y.dtype.kind in "biu" else "regression")
    x_train, x_eval = splits[0].astype(np.float32), splits[2].astype(np.float32)
    if task == "regression":
        data = ArrayData(x_train, splits[1].astype(np.float32), x_eval, splits[3].astype(np.float32), task=task)
    else:
        labels = np.concatenate([np.ravel(splits[1]), np.ravel(splits[3])])
        classes = cfg.num_classes or int(labels.max()) + 1
        data = ArrayData(x_train, splits[1].astype(np.int32), x_eval, splits[3].astype(np.int32), task=task, num_classes=classes)
    checks.check_data(data, where)
    return data


def load_source(cfg):
    """Call the function: NumPy arrays become an ArrayData; a dataset function is read once for its spec."""
    fn = _function(cfg)
    if "input_context" not in _params(fn):
        return _arrays(cfg, _call(cfg, fn))
    import tensorflow as tf

    ds = _dataset(cfg, fn, tf.distribute.InputContext(), "train", 32)
    x, y = _pair_spec(cfg, ds)
    task = cfg.task if cfg.task != "auto" else ("classification" if y.dtype.is_integer else "regression")
    if task == "classification" and cfg.num_classes is None:
        raise ConfigError(
            f"{WHERE}={cfg._target_!r} yields integer labels (classification), and data.num_classes is not set: the "
            "model's output needs it. Set data.num_classes, or data.task=regression."
        )
    outputs = cfg.num_classes if task == "classification" else math.prod(y.shape[1:]) or 1
    return FunctionSource(
        fn, cfg._target_, _kwargs(cfg), tuple(x.shape[1:]), int(outputs), task, cfg.num_classes, cfg.train_examples
    )


def _dataset(cfg, fn, context, split: str, batch_size: int, global_batch_size: int | None = None):
    import tensorflow as tf

    ds = _call(cfg, fn, input_context=context, split=split, batch_size=batch_size, global_batch_size=global_batch_size)
    if not isinstance(ds, tf.data.Dataset):
        raise ConfigError(
            f"{WHERE}={cfg._target_!r} takes an input_context, so it must return a tf.data.Dataset; it returned "
            f"{type(ds).__name__}."
        )
    return ds


def _pair_spec(cfg, ds):
    """The (x, y) TensorSpecs of batches: rank 2 or more for x, 1 or more for y, numbers."""
    import tensorflow as tf

    spec = ds.element_spec
    ok = isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(s, tf.TensorSpec) for s in spec)
    if ok:
        x, y = spec
        ok = x.shape.rank is not None and x.shape.rank >= 2 and y.shape.rank is not None and y.shape.rank >= 1
        ok = ok and x.dtype.is_floating | x.dtype.is_integer and y.dtype.is_floating | y.dtype.is_integer
        ok = ok and x.shape[1:].is_fully_defined()
    if not ok:
        raise ConfigError(
            f"{WHERE}={cfg._target_!r} returned a dataset of {spec}; it must yield batches (x, y): numeric tensors, x of "
            "shape (batch, features...) with every feature dimension known, y of shape (batch,) or (batch, outputs)."
        )
    return spec


@dataclass(kw_only=True)
class FunctionData(StreamedData):
    # source: FunctionSource

    def _pipeline(self, context, split: str, batch_size: int, train: bool):
        import tensorflow as tf

        source = self.source
        ds = _dataset(_Named(source), source.fn, context, split, batch_size, self.global_batch_size)
        x, y = ds.element_spec
        if tuple(x.shape[1:]) != source.input_shape:
            raise ConfigError(
                f"{WHERE}={source.target!r}: the {split} split's examples have shape {tuple(x.shape[1:])}, the training "
                f"split's {source.input_shape}; the model takes one input shape."
            )
        if train:
            ds = ds.repeat()
        elif ds.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise ConfigError(
                f"{WHERE}={source.target!r}: the eval split repeats forever, so evaluation would never end; repeat only "
                'when split == "train".'
            )
        label_type = tf.int32 if source.task == "classification" else tf.float32

        def cast(x, y):  # as the in-memory sources give them: float32 features, int32 class indices
            return tf.cast(x, tf.float32), tf.cast(y, label_type)

        ds = ds.map(cast, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return finish(ds, self.prefetch, "OFF")  # the function shards by its input_context

    def train_dataset(self):
        import tensorflow as tf

        return self._pipeline(tf.distribute.InputContext(), "train", self.global_batch_size, train=True)

    def eval_dataset(self):
        import tensorflow as tf

        return self._pipeline(tf.distribute.InputContext(), "eval", self.global_batch_size, train=False)

    def dataset_fn(self, input_context):
        batch = input_context.get_per_replica_batch_size(self.global_batch_size)
        return self._pipeline(input_context, "train", batch, train=True)


@dataclass
class _Named:
    """What error messages need of the config, from the source (the dataset function runs where no config is)."""

    source: FunctionSource

    @property
    def _target_(self):
        return self.source.target

    @property
    def kwargs(self):
        return self.source.kwargs


def build_function_data(cfg, source, train_cfg, *, cluster=None, parameter_server=False):
    """Arrays: the in-memory pipeline. A dataset function: its own, with steps from data.train_examples or
    train.steps_per_epoch."""
    if not isinstance(source, FunctionSource):
        return array_data(cfg, source, train_cfg)
    if cfg.input == "numpy":
        raise ConfigError(
            f"data.input=numpy needs the data in memory, and {WHERE}={cfg._target_!r} returns a tf.data.Dataset; use "
            "data.input=tf_data or data.input=from_function (or return NumPy arrays)."
        )
    steps = train_cfg.steps_per_epoch
    if steps is None:
        if source.train_examples is None:
            raise ConfigError(
                f"{WHERE}={cfg._target_!r} returns a dataset, whose size the runner does not know: set "
                "train.steps_per_epoch, or data.train_examples (the steps are then that // train.global_batch_size)."
            )
        steps = max(1, source.train_examples // train_cfg.global_batch_size)
    return FunctionData.of(cfg, source, train_cfg, steps_per_epoch=steps, cluster=cluster, parameter_server=parameter_server)


def _module_found(cfg):
    """The module part of data._target_ is on the Python path: found without importing it (it may import TensorFlow)."""
    import importlib.util

    target = str(cfg.data._target_)
    module = target.rpartition(".")[0]
    if not module:
        raise ConfigError(f"{WHERE}={target!r} names no function: give module.function (my_data.make for make() in my_data.py).")
    try:
        found = bool(module) and importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that cannot be imported
        found = False
    if not found:
        raise ConfigError(
            f"{WHERE}={target!r}: no module {module or target!r} on the Python path. Name a function as module.function, "
            "and put its package on the path (PYTHONPATH=. when it is in the current directory)."
        )


register(
    "data",
    "function",
    schema=FunctionDataConfig,
    help="your own function (data._target_): NumPy arrays, or a tf.data.Dataset for each InputContext",
    build=load_source,
    probe=_module_found,
    pipeline=build_function_data,
)
