"""Typed schemas: the root config's plain nodes here, each group option's schema with its builder (runner/builders/,
through runner.config.registry), all registered in Hydra's ConfigStore by `register()`.

Each YAML option lists its schema first in its defaults (`/schema/<group>/<option>@_here_`), so a wrong type or an
unknown key fails while Hydra composes the config, before TensorFlow is imported. Defaults live here and in the
option schemas only (runner.config.fields says why); every numeric field declares its valid range and every enumerated
field its Enum beside its default, and runner.config.validate checks all of them generically.
"""

import functools
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from runner.builders.data.in_memory import NpzDataConfig  # noqa: F401  (tests build npz nodes from it)
from runner.builders.loss import Loss
from runner.builders.optimizer import Optimizer, Schedule
from runner.builders.strategy import VariablePartitionerConfig  # noqa: F401  (listed with the plain nodes' schemas)
from runner.config import helptext, hydra_private, registry
from runner.config.fields import UINT32_MAX, Range, choice, ranged  # noqa: F401  (Range, ranged: their old home)
from runner.sweeps import search_config


# --- plain nodes of the root config ---
@dataclass
class DevicesConfig:
    logical_cpus: int = ranged(1, ge=1)  # tf.config.set_logical_device_configuration: N CPU replicas without a GPU
    gpus: list[int] | None = ranged(None, ge=0, null="all GPUs")  # indices of the GPUs to make visible; None: all
    memory_growth: bool = True  # tf.config.experimental.set_memory_growth on each visible GPU


@dataclass
class ScheduleConfig:
    """The learning rate over the global step (runner.builders.optimizer): a linear warm-up from 0, then constant or a
    cosine / linear decay to final_fraction x learning_rate; logged as train/learning_rate."""

    # constant, or a cosine or linear decay after the warm-up
    name: str = choice(Schedule, "constant")
    # steps of linear warm-up from 0 to the learning rate
    warmup_steps: int = ranged(0, ge=0)
    # steps the decay takes to reach final_fraction
    decay_steps: int | None = ranged(None, ge=1, null="the run's steps after the warm-up")
    final_fraction: float = ranged(0.0, ge=0, le=1)  # the decay's end, as a fraction of learning_rate
    # your own instead: a LearningRateSchedule class of the model's Keras (or a function returning one), called with
    # kwargs alone (train.optimizer.learning_rate and the keys above do not apply then)
    _target_: str | None = None
    kwargs: Any = None  # assign it whole: train.optimizer.schedule.kwargs={initial_learning_rate:0.1,decay_steps:100}


@dataclass
class OptimizerConfig:
    # the Keras optimizer of the model's Keras
    name: str = choice(Optimizer, "sgd")
    learning_rate: float = ranged(0.05, gt=0)  # the peak, when a schedule is set
    momentum: float = ranged(0.0, ge=0, lt=1)  # sgd and rmsprop
    # clip each gradient to this norm
    clipnorm: float | None = ranged(None, gt=0, null="no clipping")
    weight_decay: float | None = ranged(None, ge=0, null="the optimizer's own (adamw: 0.004, the others: none)")  # decoupled
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    # your own optimizer: a Keras optimizer class (or a function returning one) of the model's Keras, called with
    # learning_rate (the schedule above), clipnorm and weight_decay where set, and `kwargs`; name and momentum unused
    _target_: str | None = None
    kwargs: Any = None  # {name: value}: a node Hydra can assign whole (train.optimizer.kwargs={beta_1:0.9})


class Monitored(StrEnum):
    """train.early_stopping.monitor: what the executors' evaluations report."""

    loss = "eval/loss"
    accuracy = "eval/accuracy"  # classification losses


class Mode(StrEnum):
    """train.early_stopping.mode."""

    auto = "auto"  # max for accuracy, min otherwise
    min = "min"
    max = "max"


@dataclass
class EarlyStoppingConfig:
    # with patience (or checkpoint.keep_best) set, the eval split is evaluated after every epoch
    # (runner.executors.early_stopping): stop after `patience` evaluations in a row without improvement
    patience: int | None = ranged(None, ge=1, null="never stop early")
    monitor: str = choice(Monitored, "eval/loss")  # also what checkpoint.keep_best keeps the best of
    mode: str = choice(Mode, "auto")  # auto: max for accuracy, min for a loss
    min_delta: float = ranged(0.0, ge=0)  # an improvement is more than this


@dataclass
class RecoveryConfig:
    # Model Garden's loss blow-up recovery (custom loop): a NaN or inf loss, or one above loss_upper_bound, goes back
    # to the last good checkpoint and trains on, up to max_recoveries times; then, or with 0, the run stops (exit 4)
    max_recoveries: int = ranged(0, ge=0)
    loss_upper_bound: float | None = ranged(None, gt=0, null="only NaN and inf")  # both executors: above it stops


@dataclass
class TrainConfig:
    # passes over the training data (of train.steps_per_epoch steps each)
    epochs: int = ranged(2, ge=1)
    steps_per_epoch: int | None = ranged(None, ge=1, null="one pass over the data")  # None: training examples // global batch
    global_batch_size: int = ranged(64, ge=1)  # split across replicas, as the guide describes
    # auto: from the data's task; or your own: {_target_: a Keras Loss class, a per-example function (y_true, y_pred)
    # or a function that returns either, plus its keyword arguments} (runner.builders.loss)
    loss: Any = choice(Loss, "auto", target=True)
    # your own metrics beside the loss: [{_target_: a tf_keras Metric class, or a per-example function (y_true,
    # y_pred), plus its arguments}]; logged as <name>, eval/<name> and <name>/replica_<i> (runner.builders.metrics)
    metrics: Any = None  # null: none; Any (not a list), so that a value that is no list gets the runner's paragraph
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    # seed of the weights' initialisation, the shuffling and dropout
    seed: int = ranged(0, ge=0, le=UINT32_MAX)
    # k micro-batches per update, gradients summed: the update of the whole global batch with a k-th of the activations
    # in memory at a time (runner.executors.accumulation); must divide train.global_batch_size
    accumulation_steps: int = ranged(1, ge=1)
    # steps per tf.function call, fit's Model.compile(steps_per_execution=...) and the custom loop's; auto: up to the
    # next checkpoint or epoch end, at most AUTO_STEPS_CAP, each logged step exact (runner.executors.per_call); a number wins
    steps_per_execution: int | str = ranged("auto", ge=1, why="or auto (the default), which picks it")
    # the custom loop's steps per tf.function call (steps_per_execution is fit's)
    steps_per_loop: int | str = ranged("auto", ge=1, why="or auto (the default), which picks it")
    # metrics (loss, per-replica losses) are logged to MLflow every this many steps; throughput at most once a call
    log_every_n_steps: int = ranged(10, ge=1)
    mixed_precision: bool = False  # tf_keras mixed_float16 policy (GPUs with tensor cores)
    # XLA for training: true or false; null: each Keras' own default (tf_keras fit and the custom loop: off; a Keras 3
    # model: Keras 3's auto, on where its layers support it). With in-memory data on one replica it compiles a whole
    # call of steps (under fit: where each step's logs come back with the call); across workers, the custom loop's
    # forward and backward pass; elsewhere each step. Faster where measured (docs), and not bit-identical: XLA fuses
    # and reorders float arithmetic
    jit_compile: bool | None = None
    profile_steps: list[int] | None = ranged(
        None, ge=1, null="no trace"
    )  # [first, last]: a profiler trace (runner.executors.profiling)


@dataclass
class MlflowConfig:
    # the MLflow experiment the run goes to (created when missing)
    experiment_name: str = "runner"
    run_name: str | None = None  # None: MLflow picks a name
    tracking_uri: str | None = None  # None: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here
    enabled: bool = True  # false: no MLflow at all (benchmarks of the logging cost, quick trials)
    # the background sender's period (training never waits for it); 5 s keeps what is left to send at the end small,
    # however long the run
    flush_every_sec: float = ranged(5.0, ge=1, why="sending more often slows training many times over (0 made it 10-16x slower)")
    delivery_timeout_sec: float = ranged(120.0, ge=0)  # at the end: wait this long for a server that is down, then save an outbox
    # MLflow's own system metrics (CPU, memory, disk, network; GPU where nvidia-ml-py finds one), sampled in the MLflow
    # process for the run this process owns, as system/* metrics
    system_metrics: bool = True
    # the system metrics' sampling period
    system_metrics_every_sec: float = ranged(5.0, ge=1, why="each sample also reads the run back from the store")
    # the trained model as an MLflow model (pyfunc over model.keras, runner.mlflow_process.model): loadable and servable
    log_model: bool = True
    register_as: str | None = None  # a registered model name: each run adds a version (needs log_model and save_model)


@dataclass
class CheckpointConfig:
    # false: no checkpoints (resume= and elastic training need them)
    enabled: bool = True
    dir: str | None = None  # None: <output_dir>/checkpoints (runner.config.layout)
    every_n_steps: int | None = ranged(None, ge=1, null="at the end of each epoch")  # custom loop (fit: always per epoch)
    # checkpoints kept; older ones are deleted
    max_to_keep: int = ranged(3, ge=1, why="the newest checkpoint is what resume= continues from")
    # also keep, in <dir>/best, the checkpoint where train.early_stopping.monitor was best (evaluated after each epoch)
    keep_best: bool = False
    # end with the best checkpoint's weights: the final evaluation, model.keras and the MLflow model are the best's
    restore_best: bool = False


class Pruner(StrEnum):
    """sweep.pruner: Optuna's pruners (runner.sweeps.pruning)."""

    none = "none"
    median = "median"
    successive_halving = "successive_halving"  # ASHA
    hyperband = "hyperband"


class OnFailure(StrEnum):
    """sweep.on_failure (runner.sweeps.failures)."""

    continue_ = "continue"
    stop = "stop"


@dataclass
class SweepConfig:
    # the metric a sampling sweeper (hydra/sweeper=optuna) optimises: each job returns its final value, read from
    # the summary.json the job's own process writes; the report lists the jobs best first. A list
    # ([eval/loss, summary/examples_per_sec], with hydra.sweeper.direction=[minimize, maximize]) is a search for the
    # Pareto front of several objectives
    objective: Any = "eval/loss"
    # hydra/sweeper=optuna: stop trials that are behind the others at an evaluation (each epoch's, then)
    pruner: str = choice(Pruner, "none")
    # a job that failed: the sweep goes on (continue) or starts no further job (stop); a job ended by a fault (a lost
    # peer, a signal: killed, out of memory, preempted) runs again from its checkpoint up to `retries` times
    on_failure: str = choice(OnFailure, "continue")
    # runs again of a job ended by a fault (see on_failure)
    retries: int = ranged(0, ge=0)
    # how many jobs run side by side (Hydra's basic launcher): the next starts the moment one ends, and each keeps to
    # its own share of the CPUs (and GPUs); no more than there are CPUs
    parallel: int = ranged(1, ge=1)


@dataclass
class RunnerConfig:
    strategy: Any = MISSING  # the groups: one schema per option, registered below
    cross_device_ops: Any = MISSING
    cluster: Any = MISSING
    model: Any = MISSING  # open: `_target_` plus the function's own arguments
    data: Any = MISSING
    executor: Any = MISSING
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    resume: str | None = None  # an earlier run's output directory: continue its checkpoint and MLflow run
    save_model: bool = True  # save <output_dir>/model.keras and log it as an artifact
    # checkpoints, model, MLflow run id: resume=<dir> when given, else Hydra's run directory (`runner.or`: runner.app)
    output_dir: str | None = "${runner.or:${resume},${hydra:runtime.output_dir}}"


# group -> option -> schema class, from the registry (the option's schema is declared beside its builder)
GROUP_SCHEMAS = {group: {name: o.schema for name, o in registry.options(group).items()} for group in registry.GROUPS}


@functools.cache  # once per process: the store and the resolvers outlive any one composition
def register() -> None:
    hydra_private.install()  # a mistyped key or option composed against these schemas: the closest names
    # `${runner.config_groups:}` in --help's template: its config-group section, rendered from the registry
    OmegaConf.register_new_resolver("runner.config_groups", helptext.for_template, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="runner_schema", node=RunnerConfig)
    from hydra.core.plugins import Plugins
    from hydra_plugins.runner_sweeper import RunnerOptunaSweeper

    Plugins.instance().register(RunnerOptunaSweeper)  # an editable install is not on Hydra's plugin scan path
    # hydra/sweeper=optuna: the runner's own sweeper on the current Optuna; stored after Hydra's plugin scan (above),
    # so that a hydra-optuna-sweeper left installed from an earlier version does not take the name back
    search_config.register(cs)
    for group in registry.GROUPS:
        for option in registry.options(group).values():
            cs.store(group=f"schema/{group}", name=option.name, node=option.node())
