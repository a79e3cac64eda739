"""Pure checks of the composed config: config in, ConfigError out, no I/O (no files, network, environment or
machine state: those are runner.preflight.needs's). Run before TensorFlow is imported.

Types and unknown keys are already caught by the schemas while Hydra composes. Ranges and choices are declared beside
each field's default (runner.config.fields) and checked here by one generic walk each; which options go together comes
from the capabilities each option registers (runner.config.registry). Each check is one small function with a message
that names the bad value and the valid choices.

`validate(cfg)` runs these, then the pre-flight probes: the entry point callers have always used.
"""

import dataclasses
import math
import re
from collections.abc import Callable

from omegaconf import DictConfig, ListConfig, OmegaConf

from runner.builders import strategy_auto
from runner.builders.loss import Loss
from runner.config import kubernetes_pod, registry
from runner.config.fields import choices
from runner.config.suggest import unknown_key_problem, unknown_keys
from runner.errors import ConfigError
from runner.preflight import needs

CHECKS: list[Callable[[DictConfig], None]] = []


def check(fn):
    CHECKS.append(fn)
    return fn


def check_config(cfg: DictConfig) -> None:
    """Every pure check, in order; the first problem raises ConfigError."""
    whole(cfg)
    for fn in CHECKS:
        fn(cfg)


def whole(cfg: DictConfig) -> None:
    """Every part of the runner's config is there: `~train` or `~strategy` on the command line removes one that every
    run reads (the schema's keys), which would end in OmegaConf's traceback wherever it is first read."""
    from runner.config.schema import RunnerConfig

    for key in (f.name for f in dataclasses.fields(RunnerConfig)):
        if key not in cfg or OmegaConf.is_missing(cfg, key):
            option = (
                f" or choose another option ({key}=<option>; python -m runner --help lists them)"
                if key in registry.GROUPS
                else ""
            )
            raise ConfigError(f"the config has no {key} (~{key} removes it), and every run reads it: drop ~{key}{option}.")


def validate(cfg: DictConfig) -> "strategy_auto.Choice | None":
    """strategy=auto resolved (it reads TF_CONFIG, Slurm's and CUDA's variables), the pure checks, then the
    pre-flight probes (ports, TF_CONFIG, MLflow server, directories, files). Returns strategy=auto's choice (None
    when the config names a strategy), for the caller to log, tag and check at start."""
    whole(cfg)
    if cfg.cluster.name == "kubernetes":  # this pod's TF_CONFIG, which the checks below and strategy=auto read
        kubernetes_pod.derive({k: cfg.cluster[k] for k in kubernetes_pod.SHAPE}, cfg.strategy.name)
    chosen = strategy_auto.resolve(cfg)
    check_config(cfg)
    needs.preflight(cfg)
    return chosen


def _number(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _bounds_text(r, is_int: bool) -> str:
    """`a positive integer (1 or more)`, `greater than 0`, `between 0 and 1 (exclusive)`, ..."""
    lo = r.ge if r.ge is not None else r.gt
    hi = r.le if r.le is not None else r.lt
    if lo is not None and hi is not None:
        if r.gt is not None and r.lt is not None:
            return f"between {_number(lo)} and {_number(hi)} (exclusive)"
        if r.ge is not None and r.le is not None:
            return f"between {_number(lo)} and {_number(hi)}"
        return f"{'>=' if r.ge is not None else '>'} {_number(lo)} and {'<=' if r.le is not None else '<'} {_number(hi)}"
    if r.gt is not None:
        return f"greater than {_number(r.gt)}"
    if r.ge is not None:
        if is_int and r.ge == 1 and r.null is None:
            return "a positive integer (1 or more)"
        return f"{_number(r.ge)} or more"
    if r.lt is not None:
        return f"less than {_number(r.lt)}"
    return f"{_number(r.le)} or less"


def _out_of_range(value, r) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return True
    return (
        (r.ge is not None and value < r.ge)
        or (r.gt is not None and value <= r.gt)
        or (r.le is not None and value > r.le)
        or (r.lt is not None and value >= r.lt)
    )


def _declared(node, prefix: str, meta: str):
    """(full key, declaration, value) for every set, non-null field of `node` (recursively) that declares `meta`."""
    kind = OmegaConf.get_type(node)
    declared = (
        {f.name: f.metadata[meta] for f in dataclasses.fields(kind) if meta in f.metadata}
        if dataclasses.is_dataclass(kind)
        else {}
    )
    for key in node.keys():
        full = f"{prefix}{key}"
        if isinstance(node._get_node(key), DictConfig):
            yield from _declared(node[key], full + ".", meta)
        elif key in declared and not OmegaConf.is_missing(node, key) and node[key] is not None:
            yield full, declared[key], node[key]


def range_problems(node, prefix: str = "") -> list[str]:
    """Every numeric value outside the range its schema field declares (`ranged(...)`, runner.config.fields)."""
    problems = []
    for full, r, value in _declared(node, prefix, "range"):
        items = list(value) if isinstance(value, ListConfig) else [value]
        numbers = [v for v in items if isinstance(v, (int, float)) and not isinstance(v, bool)]
        bad = [v for v in numbers if _out_of_range(v, r)]
        if not bad:
            continue
        is_int = all(isinstance(v, int) for v in numbers)
        shown = f"[{', '.join(map(str, items))}]" if isinstance(value, ListConfig) else str(value)
        finite = "finite and " if any(isinstance(v, float) and not math.isfinite(v) for v in bad) else ""
        what = ("every element must be " if isinstance(value, ListConfig) else "must be ") + finite + _bounds_text(r, is_int)
        if r.null is not None:
            what += f", or null ({r.null})"
        problems.append(f"{full}={shown} {what}." + (f" {r.why[0].upper()}{r.why[1:]}." if r.why else ""))
    return problems


def _first_of(problems: list[str]) -> None:
    if problems:
        more = f" (and {len(problems) - 1} more: {' '.join(problems[1:])})" if len(problems) > 1 else ""
        raise ConfigError(problems[0] + more)


def missing_keys(node, prefix: str = "") -> list[str]:
    """Every key whose schema declares no default (MISSING, `???`) and that the config leaves unset."""
    found = []
    for key in node.keys():
        full = f"{prefix}{key}"
        if OmegaConf.is_missing(node, key):
            found.append(full)
        elif isinstance(node._get_node(key), DictConfig):
            found += missing_keys(node[key], full + ".")
    return found


@check
def required_values(cfg):
    """A mandatory key left unset (data=npz without data.path) is named here, not as OmegaConf's traceback later."""
    for key in missing_keys(cfg):
        group = key.split(".")[0]
        option = group in registry.GROUPS and "name" in cfg[group]
        owner = f"{group}={cfg[group].name} needs it" if option else "it has no default"
        raise ConfigError(
            f"{key} is not set, and {owner}: add {key}=<value> to the command (its meaning: docs/reference/config.md, or --help)."
        )


@check
def profile_window(cfg):
    steps = cfg.train.profile_steps
    if steps is None:
        return
    steps = list(steps)
    if len(steps) != 2 or steps[0] < 1 or steps[1] < steps[0]:
        raise ConfigError(
            f"train.profile_steps={steps} must be [first, last] with 1 <= first <= last (training steps, counted from 1), "
            "e.g. train.profile_steps=[10,20]."
        )


@check
def accumulation_divides_the_batch(cfg):
    k, batch = cfg.train.accumulation_steps, cfg.train.global_batch_size
    if isinstance(k, int) and isinstance(batch, int) and k > 1 and batch % k:
        whole = [d for d in range(2, min(batch, 64) + 1) if batch % d == 0][:6]
        raise ConfigError(
            f"train.accumulation_steps={k} does not divide train.global_batch_size={batch}: each update is made of "
            f"{k} micro-batches, a k-th of each replica's share of the global batch. Use a divisor of {batch}"
            + (f" ({', '.join(map(str, whole))})" if whole else " (1: no accumulation)")
            + f", or a global batch that is a multiple of {k}."
        )


@check
def accumulation_fits_the_strategy(cfg):
    k = cfg.train.accumulation_steps
    if isinstance(k, int) and k > 1 and cfg.executor.name == "fit" and cfg.strategy.name == "central_storage":
        raise ConfigError(
            f"train.accumulation_steps={k} with executor=fit is not supported under strategy=central_storage: "
            "Model.fit's loss and metrics are updated inside the micro-batch loop, and CentralStorageStrategy's "
            "variables need a cross-replica sync there that TensorFlow refuses inside a loop (RuntimeError: merge_call "
            "called while defining a new graph). Use executor=custom_loop, or strategy=mirrored."
        )


@check
def best_checkpoint(cfg):
    ckpt = cfg.checkpoint
    if ckpt.restore_best and not ckpt.keep_best:
        raise ConfigError(
            "checkpoint.restore_best=true restores the best checkpoint, which only checkpoint.keep_best=true keeps: "
            "add checkpoint.keep_best=true (the best by train.early_stopping.monitor, evaluated after each epoch)."
        )
    if ckpt.keep_best and not ckpt.enabled:
        raise ConfigError(
            "checkpoint.keep_best=true keeps a checkpoint, and checkpoint.enabled=false writes none: set "
            "checkpoint.enabled=true, or leave checkpoint.keep_best out."
        )


@check
def early_stopping(cfg):
    es = cfg.train.early_stopping
    if es.patience is not None and cfg.cluster.get("evaluator"):
        raise ConfigError(
            f"train.early_stopping.patience={es.patience} may end training before its last step, which "
            "cluster.evaluator=true's side-car waits for; leave one of them out (early stopping evaluates after each "
            "epoch on its own)."
        )
    watched = es.patience is not None or cfg.checkpoint.keep_best
    own_metrics = bool(cfg.train.get("metrics"))  # one of them may be named accuracy: checked once they are made
    if watched and es.monitor == "eval/accuracy" and cfg.train.loss == "mse" and not own_metrics:
        raise ConfigError(
            "train.early_stopping.monitor=eval/accuracy is not evaluated with train.loss=mse (regression has no "
            "accuracy): use train.early_stopping.monitor=eval/loss."
        )
    if watched and es.monitor == "eval/accuracy" and isinstance(cfg.train.loss, DictConfig) and not own_metrics:
        raise ConfigError(
            f"train.early_stopping.monitor=eval/accuracy is not evaluated with your own train.loss "
            f"(_target_={cfg.train.loss.get('_target_')}): a user's loss is evaluated as eval/loss only. Use "
            "train.early_stopping.monitor=eval/loss, a built-in loss, or a metric of your own (train.metrics)."
        )


@check
def own_objects(cfg):
    """train.loss, train.metrics and train.optimizer given as `_target_` nodes: their shape (whether they import and
    build is checked when the model is built: runner.builders.loss, .metrics and .optimizer)."""
    loss = cfg.train.loss
    if isinstance(loss, DictConfig) and not isinstance(loss.get("_target_"), str):
        raise ConfigError(
            f"train.loss={OmegaConf.to_yaml(loss, resolve=False).strip()!r} has no `_target_`: give a built-in name "
            f"({', '.join(choices(Loss))}) or your own loss as {{_target_: mypkg.losses.MyLoss, <its arguments>}}."
        )
    metrics = cfg.train.get("metrics")
    if metrics is not None and not isinstance(metrics, ListConfig):
        shown = OmegaConf.to_yaml(metrics, resolve=False).strip() if isinstance(metrics, DictConfig) else metrics
        raise ConfigError(
            f"train.metrics={shown!r} is not a list: give your metrics in brackets, even one, as "
            "'train.metrics=[{_target_:tf_keras.metrics.AUC,from_logits:true}]'."
        )
    for i, spec in enumerate(metrics or []):
        if not isinstance(spec, DictConfig) or not isinstance(spec.get("_target_"), str):
            shown = OmegaConf.to_yaml(spec, resolve=False).strip() if isinstance(spec, DictConfig) else spec
            raise ConfigError(
                f"train.metrics[{i}]={shown!r} "
                "has no `_target_`: give each metric as {_target_: tf_keras.metrics.AUC, from_logits: true} or "
                "{_target_: mypkg.metrics.my_function} (a function (y_true, y_pred) of one value per example)."
            )
    opt = cfg.train.optimizer
    _kwargs_mapping("train.optimizer", opt.kwargs, "optimizer", "{beta_1:0.9,beta_2:0.99}")
    if opt.kwargs and not opt._target_:
        raise ConfigError(
            f"train.optimizer.kwargs={dict(opt.kwargs)} are the arguments of your own optimizer, and "
            "train.optimizer._target_ is not set: set it (a Keras optimizer class), or leave the kwargs out "
            f"(train.optimizer.name={opt.name} takes learning_rate, momentum, clipnorm and weight_decay)."
        )
    schedule = opt.schedule
    _kwargs_mapping(
        "train.optimizer.schedule", schedule.kwargs, "schedule", "{initial_learning_rate:0.1,decay_steps:100,decay_rate:0.5}"
    )
    if schedule.kwargs and not schedule._target_:
        raise ConfigError(
            f"train.optimizer.schedule.kwargs={dict(schedule.kwargs)} are the arguments of your own schedule, and "
            "train.optimizer.schedule._target_ is not set: set it (a Keras LearningRateSchedule class), or leave the "
            "kwargs out (the built-in schedules take name, warmup_steps, decay_steps and final_fraction)."
        )
    builtin = {
        k: schedule[k]
        for k, v in {"name": "constant", "warmup_steps": 0, "decay_steps": None, "final_fraction": 0.0}.items()
        if schedule[k] != v
    }
    if schedule._target_ and builtin:
        key = next(iter(builtin))
        raise ConfigError(
            f"train.optimizer.schedule.{key}={builtin[key]} is a key of the built-in schedules, and "
            f"train.optimizer.schedule._target_={schedule._target_} is your own, which takes only its kwargs: leave "
            f"train.optimizer.schedule.{key} out, or drop the _target_."
        )
    taken = sorted(set(opt.kwargs or {}) & {"learning_rate", "clipnorm", "weight_decay"})
    if opt._target_ and taken:
        raise ConfigError(
            f"train.optimizer.kwargs.{taken[0]} is set, and the runner passes {taken[0]} to "
            f"train.optimizer._target_={opt._target_} itself: set train.optimizer.{taken[0]} instead (the learning "
            "rate follows train.optimizer.schedule and is logged as train/learning_rate)."
        )


@check
def elastic(cfg):
    """cluster.elastic: where the launcher can restart a multi-worker job at another size (runner.launch.elastic)."""
    settings = cfg.cluster.elastic if "elastic" in cfg.cluster.keys() else None  # (get, in: OmegaConf raises inside)
    if not settings or not settings.enabled:
        return
    where = f"cluster.elastic.enabled=true (cluster={cfg.cluster.name}, strategy={cfg.strategy.name})"
    if cfg.cluster.name not in ("localhost", "ray", "slurm", "tf_config", "kubernetes"):
        raise ConfigError(
            f"{where}: elastic training is launched by cluster=localhost, ray, slurm, tf_config and kubernetes "
            "so far (their launcher or agents restart the tasks); use one of them, or cluster.elastic.enabled=false."
        )
    if cfg.strategy.name not in ("multi_worker_mirrored", "parameter_server"):
        raise ConfigError(
            f"{where}: elastic training restarts a multi_worker_mirrored job at another size, and a parameter_server "
            "job whose parameter server is lost; other strategies run in one process. Use one of them, or "
            "cluster.elastic.enabled=false."
        )
    if "workers" not in cfg.cluster:  # slurm, tf_config: the allocation or TF_CONFIG tells the size; their launcher checks
        return
    # the job's size as the user set it: cluster.workers, or under Slurm the allocation's task count
    slurm = cfg.cluster.name == "slurm"
    size = f"{cfg.cluster.workers} tasks (SLURM_NTASKS)" if slurm else f"cluster.workers={cfg.cluster.workers}"
    whose = "the allocation's" if slurm else "the job's"
    if settings.min_workers > cfg.cluster.workers:
        raise ConfigError(
            f"cluster.elastic.min_workers={settings.min_workers} is above {whose} {size}: "
            f"the job could never start. Set cluster.elastic.min_workers to at most {cfg.cluster.workers}."
        )
    if not cfg.checkpoint.enabled:
        raise ConfigError(
            f"{where} goes on from the last checkpoint after a loss, and checkpoint.enabled=false writes none: set "
            "checkpoint.enabled=true (checkpoint.every_n_steps bounds the steps a loss costs)."
        )
    if cfg.cluster.get("evaluator"):
        raise ConfigError(
            f"{where} with cluster.evaluator=true: the side-car evaluator follows one generation of tasks; leave one of them out."
        )
    if cfg.strategy.name == "parameter_server":  # restarted whole at its own size: the same global batches
        return
    if cfg.cluster.workers < 2 or settings.min_workers == cfg.cluster.workers:
        raise ConfigError(
            f"{where} with {size} and cluster.elastic.min_workers={settings.min_workers}: "
            "such a job cannot train through a single loss. Give it more workers than min_workers, or leave "
            "cluster.elastic out."
        )
    if cfg.data.name == "tfrecord" and cfg.data.input == "tf_data" and cfg.data.shard_policy != "data":
        raise ConfigError(
            f"{where} with data=tfrecord data.shard_policy={cfg.data.shard_policy}: split by file, the global batches "
            "would change with the number of workers, so a resize would change what is trained on. Set "
            "data.shard_policy=data: every worker reads every file and takes its share of each global batch, the same "
            "examples at any size."
        )
    if cfg.data.name in ("tfds", "image_folder", "function") or cfg.data.input != "tf_data":
        raise ConfigError(
            f"{where} with data={cfg.data.name} data.input={cfg.data.input}: at another number of workers this input "
            "would not give the same global batches (it is split by file, by worker or by Keras itself), so a resize "
            "would change what is trained on. Elastic jobs read in-memory data or TFRecord files (data.shard_policy=data) "
            "with data.input=tf_data so far."
        )
    gbs, sizes = cfg.train.global_batch_size, range(settings.min_workers, cfg.cluster.workers + 1)
    uneven = [n for n in sizes if gbs % n]
    if uneven:
        raise ConfigError(
            f"train.global_batch_size={gbs} does not divide over {uneven[0]} worker(s), a size this elastic job may "
            f"train at (cluster.elastic.min_workers={settings.min_workers} to {size}): "
            "uneven shares change Model.fit's loss (a mean of per-replica means) and the batches each worker reads. "
            f"Use a multiple of every size, such as {math.lcm(*sizes) * max(1, round(gbs / math.lcm(*sizes)))}."
        )


def _kwargs_mapping(key: str, kwargs, what: str, example: str) -> None:
    """`<key>.kwargs`, the arguments of one's own object, must be a mapping."""
    if kwargs is not None and not isinstance(kwargs, DictConfig):
        raise ConfigError(f"{key}.kwargs={kwargs!r} is not a mapping: give your {what}'s arguments as {key}.kwargs={example}.")


@check
def recovery(cfg):
    n = cfg.train.recovery.max_recoveries
    if not isinstance(n, int) or n <= 0:
        return
    if cfg.executor.name != "custom_loop":
        raise ConfigError(
            f"train.recovery.max_recoveries={n} goes back to a checkpoint in the middle of training, which only "
            f"executor=custom_loop can do (Model.fit has no way back inside fit()); use executor=custom_loop, or "
            "train.recovery.max_recoveries=0 (train.recovery.loss_upper_bound alone stops a run in both)."
        )
    if not cfg.checkpoint.enabled:
        raise ConfigError(
            f"train.recovery.max_recoveries={n} goes back to the last good checkpoint, and checkpoint.enabled=false "
            "writes none: set checkpoint.enabled=true (checkpoint.every_n_steps sets how far back a recovery goes)."
        )


@check
def steps_per_call(cfg):
    """train.steps_per_execution and steps_per_loop: a positive integer (the range check) or auto."""
    for key in ("steps_per_execution", "steps_per_loop"):
        value = cfg.train[key]
        if isinstance(value, str) and value != "auto":
            raise ConfigError(
                f"train.{key}={value!r} must be a positive integer (steps per tf.function call) or auto (the default: "
                f"as many as keep every logged step, up to 100): e.g. train.{key}=10, or leave it out."
            )


@check
def xla_on_logical_cpus(cfg):
    """train.jit_compile=true with replicas on logical CPU devices: XLA's compiled step reads a variable of another
    logical device and TensorFlow refuses it at the first step (mirrored under either executor, central_storage
    under fit; central_storage's custom loop and one replica train)."""
    n, strategy, executor = cfg.devices.logical_cpus, cfg.strategy.name, cfg.executor.name
    if not cfg.train.jit_compile or n < 2 or not (strategy == "mirrored" or (strategy, executor) == ("central_storage", "fit")):
        return
    raise ConfigError(
        f"train.jit_compile=true cannot compile the step of strategy={strategy} over devices.logical_cpus={n} "
        "(executor=" + executor + "): TensorFlow's XLA step reads variables across the logical CPU devices and refuses "
        "at the first step. Leave train.jit_compile unset, or use devices.logical_cpus=1"
        + (", or executor=custom_loop." if strategy == "central_storage" else ".")
    )


@check
def xla_with_parameter_servers(cfg):
    """train.jit_compile=true under parameter_server: the variables live on the ps tasks, and XLA's compiled step
    cannot read a resource of another task (TensorFlow refused at the first step, under either executor)."""
    if cfg.train.jit_compile and cfg.strategy.name == "parameter_server":
        raise ConfigError(
            "train.jit_compile=true cannot compile the step of strategy=parameter_server: its variables live on the ps "
            "tasks, and an XLA step can only read variables of the worker that runs it. Leave train.jit_compile unset, "
            "or use strategy=multi_worker_mirrored with executor=custom_loop for XLA across workers."
        )


@check
def ranges(cfg):
    """The one generic range check: every numeric field against the range declared beside it."""
    _first_of(range_problems(cfg))


@check
def enumerations(cfg):
    """The one generic choice check: every enumerated field (`choice(Enum, default)`) against its Enum's values."""
    _first_of(
        [
            f"{full}={str(value)!r} is not valid; choose one of: {', '.join(choices(kind))}"
            + (", or eval/<name> of one of your own train.metrics." if full == MONITOR else ".")
            for full, kind, value in _declared(cfg, "", "choices")
            if str(value) not in choices(kind) and not _own_metric(cfg, full, str(value))
        ]
    )


MONITOR = "train.early_stopping.monitor"


def _own_metric(cfg, full: str, value: str) -> bool:
    """The monitor names one of the user's train.metrics (eval/<its name>): their names are known once they are made,
    after TensorFlow's import, and checked there (runner.builders.metrics.check_metrics)."""
    return full == MONITOR and value.startswith("eval/") and bool(cfg.train.get("metrics"))


@check
def no_unknown_keys(cfg):
    found = unknown_keys(cfg)
    if found:
        key, known = found[0]
        parent = key.rpartition(".")[0]
        selected = cfg[parent].get("name") if parent in registry.GROUPS else None
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
        problem = unknown_key_problem(key, known, value=value, selected=selected, how=f" (added with +{key}=...?)")
        raise ConfigError(f"{problem} Remove it, or correct its name.")


def _selected(cfg):
    """The registered option of each group; an unknown one (a YAML without its registration) is refused here."""
    return {group: registry.selected(cfg, group) for group in registry.GROUPS}


@check
def cross_device_ops_fit_strategy(cfg):
    strategy, ops = cfg.strategy.name, cfg.cross_device_ops.name
    allowed = _selected(cfg)["strategy"].caps.cross_device_ops
    if ops not in allowed:
        takers = [s.name for s in registry.options("strategy").values() if ops in s.caps.cross_device_ops]
        raise ConfigError(
            f"cross_device_ops={ops} does not apply to strategy={strategy}; "
            f"strategy={strategy} takes cross_device_ops={' or '.join(allowed)}"
            + (f", and {ops} is for strategy={' or '.join(takers)}." if takers else ".")
        )


@check
def option_checks(cfg):
    """Each selected option's own cross-field check (`check=` where it is registered): the cluster's first."""
    for group in ("cluster", "strategy", "cross_device_ops", "data", "executor"):
        own = _selected(cfg)[group].caps.check
        if own is not None:
            own(cfg)


@check
def strategy_fits_cluster(cfg):
    selected = _selected(cfg)
    if selected["cluster"].caps.processes and not selected["strategy"].caps.multi_process:
        takers = [s.name for s in registry.options("strategy").values() if s.caps.multi_process]
        alone = [c.name for c in registry.options("cluster").values() if not c.caps.processes and c.caps.check is None]
        raise ConfigError(
            f"strategy={cfg.strategy.name} runs in one process and cannot use cluster={cfg.cluster.name}; "
            f"use {' or '.join('strategy=' + t for t in takers)}, or {' or '.join('cluster=' + c for c in alone)}."
        )


@check
def strategy_takes_input(cfg):
    inputs = _selected(cfg)["strategy"].caps.inputs
    if inputs is not None and cfg.data.input not in inputs:
        raise ConfigError(
            f"data.input={cfg.data.input} is not supported with strategy={cfg.strategy.name}; use data.input={inputs[0]}."
        )


# what a run's summary.json holds beside eval/<name> (runner.experiment: the run's final figures), for sweep.objective
SUMMARY_FIGURES = (
    "final_loss",
    "summary/examples_per_sec",
    "summary/examples_per_sec_per_replica",
    "summary/step_time_ms",
    "time/train_sec",
    "time/first_step_sec",
    "time/to_first_step_sec",
)


@check
def sweep_objective(cfg):
    """sweep.objective: figures every run writes (a sampling sweeper reads them), one or a list of them."""
    objective = cfg.sweep.objective
    names = list(objective) if isinstance(objective, ListConfig) else [objective]
    for name in names or [None]:  # an empty list names no figure either
        if not isinstance(name, str) or not (name.startswith("eval/") or name in SUMMARY_FIGURES):
            raise ConfigError(
                f"sweep.objective={OmegaConf.to_container(objective) if isinstance(objective, ListConfig) else objective!r}: "
                f"{'an empty list' if name is None else repr(name)} is not a figure a run reports. Give eval/<metric> "
                "(eval/loss, eval/accuracy, or one of "
                f"train.metrics), or one of {', '.join(SUMMARY_FIGURES)}; a list of them searches for their Pareto front."
            )


@check
def keras_app_model(cfg):
    """model=keras_app: weights to download (imagenet), a resize_to that is not [h, w], keys it sets itself."""
    from runner.models import keras_app_problem  # no TensorFlow

    if cfg.model.get("_target_") == "runner.models.keras_app":
        problem = keras_app_problem(OmegaConf.to_container(cfg.model, resolve=True))
        if problem:
            raise ConfigError(problem)


MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


MAX_EXPERIMENT_NAME = 500  # MLflow's MAX_EXPERIMENT_NAME_LENGTH (mlflow.utils.validation; not imported here)


@check
def experiment_name_length(cfg):
    """MLflow refuses a longer experiment name, which its error made look like a tracking-URI problem."""
    name = str(cfg.mlflow.experiment_name)
    if len(name) > MAX_EXPERIMENT_NAME:
        raise ConfigError(
            f"mlflow.experiment_name is {len(name)} characters long ({name[:40]}...): MLflow takes at most "
            f"{MAX_EXPERIMENT_NAME}. Use a shorter name."
        )


@check
def registered_model_name(cfg):
    """mlflow.register_as: a name `models:/<name>/<version>` can carry, and a model to register."""
    name = cfg.mlflow.register_as
    if name is None:
        return
    if not MODEL_NAME.fullmatch(str(name)):
        raise ConfigError(
            f"mlflow.register_as={name!r} is not a usable model name: use 1-200 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit (it becomes models:/<name>/<version>)."
        )
    if not (cfg.mlflow.log_model and cfg.save_model and cfg.mlflow.enabled):
        off = [k for k, v in (("mlflow.enabled", cfg.mlflow.enabled), ("save_model", cfg.save_model),
                              ("mlflow.log_model", cfg.mlflow.log_model)) if not v]  # fmt: skip
        raise ConfigError(
            f"mlflow.register_as={name} registers the logged model, but {' and '.join(k + '=false' for k in off)}: "
            "drop mlflow.register_as, or turn them back on."
        )
