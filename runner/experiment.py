"""One task of an experiment, in the order data flows:
devices -> cluster -> strategy -> data -> model -> executor, inside the MLflow run.

In a cluster, this process plays its TF_CONFIG task: ps (and, under parameter_server, worker) tasks serve
variables and steps, an evaluator evaluates checkpoints, and the rest train. Only the chief logs and saves.
"""

import contextlib
import gc
import logging
import os
import platform

from omegaconf import DictConfig

from runner.builders import own_code
from runner.config import layout
from runner.control import contract, stopping
from runner.env import native_stderr_captured
from runner.errors import RunnerError
from runner.executors import xla
from runner.launch import peers
from runner.sources import faults, in_memory
from runner.sources.description import describe as describe_data
from runner.tracking import phases
from runner.tracking.logged_model import log_mlflow_model
from runner.tracking.run import NullRun, discard_prestarted, mlflow_run, task_overrides, where_line

log = logging.getLogger("runner")


def _model_keys(cfg: DictConfig) -> str:
    """This run's model config as overrides (model=mlp model.hidden_units=[64,64] ...), for errors that name it."""
    import json

    from omegaconf import OmegaConf

    model = OmegaConf.to_container(cfg.model, resolve=True)
    keys = [
        f"model.{k}={v if isinstance(v, str) else json.dumps(v, separators=(',', ':'))}"
        for k, v in model.items()
        if k != "_target_"
    ]
    try:
        from hydra.core.hydra_config import HydraConfig

        choice = HydraConfig.get().runtime.choices.get("model") if HydraConfig.initialized() else None
    except Exception:  # no Hydra here (a test, a task's own composition): the keys alone
        choice = None
    return " ".join([f"model={choice}"] * bool(choice) + keys)


def _import_tensorflow(devices_cfg):
    """Import TensorFlow and lay out devices, with its C++ start-up chatter hidden."""
    with native_stderr_captured():
        # The import makes hundreds of thousands of long-lived objects, and the collector rescans them again and
        # again as they pile up (docs/dev/benchmarks.md). Collect nothing during it, then keep them out of its way.
        gc.disable()
        try:
            import tensorflow as tf
            import tf_keras  # noqa: F401  (the builders use it next)
        finally:
            gc.freeze()
            gc.enable()

        from runner.builders.devices import build_devices

        tf.get_logger().setLevel(logging.ERROR)
        tf.get_logger().addFilter(_not_the_coordinators_closure_errors)
        import absl.logging

        absl.logging.set_verbosity(absl.logging.ERROR)
        return tf, build_devices(devices_cfg)


def _not_the_coordinators_closure_errors(record: logging.LogRecord) -> bool:
    """The parameter-server coordinator logs a page per failed closure when a task is lost; the error then reaches
    the training loop, which says in one paragraph which task was lost and what to do (runner.launch.peers)."""
    return not record.pathname.endswith(os.path.join("coordinator", "cluster_coordinator.py"))


def _checkpoints_of(cfg):
    return layout.checkpoint_dir(cfg) if cfg.checkpoint.enabled and cfg.output_dir else None


def strategy_devices(strategy, devices):
    """Where this worker's replicas run (the default strategy has no device list: it is the first device)."""
    try:
        return list(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError, NotImplementedError):
        return devices.compute[:1]


def run_experiment(cfg: DictConfig, chosen=None) -> dict:
    """Train as this process's task of the experiment; `chosen`: strategy=auto's `Choice`, when it chose."""
    tf, devices = _import_tensorflow(cfg.devices)
    phases.mark("imports")  # Hydra, validation, TensorFlow
    from runner.builders.cluster import build_cluster

    cluster = build_cluster(cfg.cluster)
    role = layout.task_role(cfg.strategy.name, cluster.task_type)
    if role == layout.SERVER:
        from runner.launch.serving import serve

        return serve(tf, cluster, cfg.cluster)
    if role == layout.EVALUATOR:
        from runner.executors.evaluator import evaluate_checkpoints

        return evaluate_checkpoints(cfg, cluster)
    stopping.install()  # Ctrl-C / SIGTERM: checkpoint at a step boundary, run KILLED (servers keep the defaults)
    peers.quiet_watcher_threads()  # a lost peer: one paragraph from the training thread, not a trace per TF thread
    logs = cluster.is_chief and cfg.mlflow.enabled
    if not logs:
        discard_prestarted()
    tags = chosen.tags if chosen else {}
    run_context = mlflow_run(cfg, task_overrides(), tags) if logs else contextlib.nullcontext(NullRun())
    with run_context as run, stopping.Sentinel(run, cfg.output_dir) as sentinel:
        phases.mark("mlflow start")
        try:
            summary = _train(cfg, tf, devices, cluster, run, sentinel, chosen)
        except (Exception, SystemExit) as err:  # a peer lost (3), a damaged record (5), your code raising or exiting (6)
            step, kept = getattr(run, "last_step", None), _checkpoints_of(cfg)
            told = _told(
                err,
                stopping.wrapped,
                lambda e: xla.refused(e, cfg, trained=phases.trained()),
                lambda e: peers.lost_peer(e, cluster.task, cluster.jobs, cfg.output_dir, kept),
                lambda e: faults.damaged_data(e, cfg.data, step, cfg.output_dir, kept),
                lambda e: own_code.raised(e, cfg, step, cfg.output_dir, kept, trained=phases.trained()),
            )
            if told is None:
                raise
            raise told from err  # TensorFlow's trace goes to the run's error.txt (tracking.mlflow_run), not the terminal
        # The process's clock so far, phase by phase (the last phase, ending the run, is only in the log line).
        run.log_metrics(
            {f"time/phase/{name.replace(' ', '_')}_sec": sec for name, sec in phases.durations().items()}, summary["steps"]
        )
    phases.mark("mlflow end")  # the last metrics delivered, the run ended
    log.info(phases.summary())
    if cluster.is_chief and not os.environ.get(contract.ATTACH_RUN):  # a launched task's launcher says it
        log.info(where_line(run, cfg))
    return summary


def _told(err: BaseException, *handlers):
    """The first handler's error that names what went wrong with `err`; a handler that fails itself is passed over
    (the original error is raised then, not a traceback of the handler's inside the first's)."""
    for handler in handlers:
        try:
            told = handler(err)
        except Exception as err:  # noqa: BLE001
            log.debug("an error handler failed: %r", err)
            continue
        if told is not None:
            return told
    return None


def _loss_for(model, cfg, arrays, run):
    """train.loss for this model: checked against the data first (its input, its output width), then told whether
    the model outputs probabilities (a softmax or sigmoid last layer: from_logits=False) or logits."""
    from runner.builders.loss import CROSSENTROPIES, for_outputs, loss_name
    from runner.builders.model_outputs import PROBABILITIES, check_input, check_output
    from runner.builders.targets import probe_examples

    target = cfg.model.get("_target_")
    check_input(model, target, arrays.input_shape, getattr(getattr(arrays, "x_train", None), "dtype", None))
    loss = loss_name(cfg.train, arrays.task)
    kind, layer = check_output(model, target, loss, arrays.num_outputs, arrays.task, probe_examples(arrays)[0])
    if loss in CROSSENTROPIES:
        run.set_tags({"model_outputs": kind})
        log.info("the model outputs %s: its last layer is %s; %s with from_logits=%s", kind, layer, loss, kind != PROBABILITIES)
    return for_outputs(loss, kind)


def _train(cfg, tf, devices, cluster, run, sentinel, chosen) -> dict:
    import tf_keras

    from runner.builders.data.pipeline import build_data
    from runner.builders.executor import build_executor
    from runner.builders.keras_flavor import check_keras3, keras_of, optimizer_clipping
    from runner.builders.loss import check_user_loss
    from runner.builders.metrics import check_metrics
    from runner.builders.model import build_model
    from runner.builders.optimizer import build_optimizer, scheduled
    from runner.builders.strategy import build_strategy, strategy_name
    from runner.config.model_defaults import inherited_model_keys
    from runner.control.trial_report import TrialReport
    from runner.executors.accumulation import warn_batch_norm
    from runner.executors.base import Job, done_line, earlier_rate, nothing_left
    from runner.executors.checkpoints import Checkpoints
    from runner.executors.early_stopping import watch_for
    from runner.executors.profiling import Profile
    from runner.sweeps.search import objectives

    waiting = cluster.resolver is not None and cfg.cluster.name != "tpu"  # peers to wait for
    joining = sentinel.deadline(cfg.cluster.start_timeout_sec, f"{cluster.task}: joining the cluster")
    with joining if waiting else contextlib.nullcontext():
        strategy = build_strategy(cfg.strategy, cfg.cross_device_ops, devices, cluster)
    if chosen:
        chosen.check_gpus(len(devices.gpus))
    replicas = strategy.num_replicas_in_sync
    placed = strategy_devices(strategy, devices)
    parameter_server = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
    log.info(
        "%s%s with %d replica(s)%s on %s",
        f"{cluster.task}: " if cluster.task_type else "",
        strategy_name(strategy),
        replicas,
        f" per step (its {cluster.num_workers} worker(s) each run whole steps, asynchronously)" if parameter_server else "",
        ", ".join(placed),
    )
    run.set_tags(
        {
            "strategy": strategy_name(strategy),
            "num_replicas_in_sync": replicas,
            "num_workers": cluster.num_workers,
            "devices": ",".join(placed),
            "tensorflow_version": tf.__version__,
            "tf_keras_version": tf_keras.__version__,
            "python_version": platform.python_version(),
        }
    )
    arrays = in_memory.load(cfg.data)
    run.log_inputs(describe_data(cfg.data, arrays))  # MLflow's dataset view: name, source, digest, schema, rows
    data = build_data(cfg.data, arrays, cfg.train, replicas, cluster, parameter_server)
    run.set_tags({"steps_per_epoch": data.steps_per_epoch})  # the sweep report's loss curves need the epochs' bounds
    tf_keras.utils.set_random_seed(cfg.train.seed)  # same initial weights whatever the strategy
    if cfg.train.mixed_precision:
        tf_keras.mixed_precision.set_global_policy("mixed_float16")
    total_steps = cfg.train.epochs * data.steps_per_epoch
    with strategy.scope():
        train = cfg.train
        model = build_model(
            cfg.model,
            arrays.input_shape,
            arrays.num_outputs,
            train.global_batch_size,
            train.accumulation_steps,
            task=arrays.task,
            inherited=inherited_model_keys(cfg.model),
        )
        check_keras3(
            model, cfg.model.get("_target_"), strategy, cfg.executor.name, train.mixed_precision, train.optimizer.clipnorm
        )
        warn_batch_norm(model, train.accumulation_steps)
        keras = keras_of(model)
        if keras is not tf_keras:
            run.set_tags({"keras_version": keras.__version__})
        optimizer = build_optimizer(cfg.train.optimizer, cfg.train.mixed_precision, total_steps, keras)
        clipping = optimizer_clipping(optimizer, train.optimizer.get("_target_"))
        if clipping:  # a user's optimizer that clips (its kwargs, or its own code): the same refusal as clipnorm's
            check_keras3(model, cfg.model.get("_target_"), strategy, cfg.executor.name, False, clipping)
        optimizer.build(model.trainable_variables)  # slots exist before a checkpoint is restored into them
    loss = _loss_for(model, cfg, arrays, run)
    check_user_loss(loss, model, arrays, keras)  # a user's train.loss that cannot train is refused before the first step
    watched = train.early_stopping.monitor if train.early_stopping.patience is not None or cfg.checkpoint.keep_best else None
    # so are train.metrics (and a monitor none of them is)
    check_metrics(train.metrics, loss, model, arrays, watched, strategy, train.accumulation_steps, train.early_stopping.mode)
    saves = strategy.extended.should_checkpoint  # TensorFlow's rule: this task writes checkpoints and the model
    if saves != cluster.is_chief:  # the MLflow run was started (or not) on layout.is_chief, before the strategy existed
        log.warning("%s: TensorFlow says should_checkpoint=%s, the runner's rule said %s", cluster.task, saves, cluster.is_chief)
    checkpoints = None
    if cfg.checkpoint.enabled and cfg.output_dir:
        checkpoints = Checkpoints(
            layout.checkpoint_dir(cfg),
            saves,
            cfg.checkpoint.max_to_keep,
            model=model,
            optimizer=optimizer,
            before_save=run.sync_journal,
            model_keys=_model_keys(cfg),
            run_dir=cfg.output_dir,
        )
    job = Job(
        strategy,
        model,
        optimizer,
        loss,
        data,
        cfg.train,
        cfg.executor,
        run,
        cluster=cluster,
        checkpoints=checkpoints,
        checkpoint_every=cfg.checkpoint.every_n_steps,
        profile=Profile(cfg.train.profile_steps, cfg.output_dir),
        schedule=scheduled(cfg.train.optimizer, total_steps, keras),
        watch=watch_for(cfg.train, cfg.checkpoint, checkpoints.directory if checkpoints else None, saves, loss),
        # a trial of a pruning search, in one process (a cluster's workers would all need the verdict at once)
        trial=TrialReport.from_env(cfg.output_dir, objectives(cfg)[0]) if cluster.task_type is None else None,
        restore_best=cfg.checkpoint.restore_best,
    )
    phases.mark("build")  # strategy, data, model
    result = build_executor(cfg.executor)(job)
    if not phases.trained():  # resumed at the last step: the end's figures are the earlier attempt's
        result = nothing_left(result, run, cfg.train.global_batch_size, strategy.num_replicas_in_sync)
    elif result.examples_per_sec is None:  # resumed within a call of the end: its rate is the earlier attempts'
        result = earlier_rate(result, run, cfg.train.global_batch_size, strategy.num_replicas_in_sync)
    job.profile.log_to(run)
    if cfg.save_model and saves and cfg.output_dir:
        path = layout.model_path(cfg.output_dir)
        try:
            model.save(path)
        except OSError as err:  # a full or read-only disk after training: the checkpoints hold the trained weights
            kept = (
                f"its last checkpoint is kept: free space there, then resume={cfg.output_dir} saves it"
                if checkpoints
                else "no checkpoint holds the weights (checkpoint.enabled=false): free space there and run again"
            )
            raise RunnerError(
                f"the trained model could not be saved to {path} ({err.strerror or err}). Training is done and {kept} "
                "(or set save_model=false)."
            ) from None
        run.log_artifact(path, "model")
        log.info("model saved to %s", path)
        if cfg.mlflow.log_model:
            log_mlflow_model(run, path, arrays, cfg.mlflow.register_as)
    phases.mark("save")
    log.info(done_line(result, result.summary))
    pruned = {"sweep/pruned_at_step": job.trial.pruned_at} if job.trial and job.trial.pruned_at is not None else {}
    return {"run_id": run.run_id, "steps": result.steps, "final_loss": result.final_loss, **result.eval, **result.summary,
            **pruned}  # fmt: skip
