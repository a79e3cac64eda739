"""The evaluator task: side-car evaluation of each checkpoint the chief writes, as it appears.

It builds the same model without a strategy, restores each new checkpoint, evaluates on the eval split
and reports `sidecar/*` metrics at the checkpoint's step. It stops after the final step's checkpoint.
New checkpoints come from tf.train.checkpoints_iterator: it polls every second and, with no timeout, waits as
long as training runs; the end of training is the final step's checkpoint, seen here.
"""

import contextlib
import logging
import os

from runner.config import layout
from runner.control import contract
from runner.sources import in_memory
from runner.tracking.run import NullRun, mlflow_run

log = logging.getLogger("runner")


def evaluate_checkpoints(cfg, cluster) -> dict:
    import tensorflow as tf

    from runner.builders.data.pipeline import build_data
    from runner.builders.loss import build_loss, for_outputs, loss_name
    from runner.builders.metrics import build_metrics
    from runner.builders.model import build_model
    from runner.builders.model_outputs import check_output
    from runner.builders.targets import probe_examples
    from runner.config.model_defaults import inherited_model_keys

    arrays = in_memory.load(cfg.data)
    data = build_data(cfg.data, arrays, cfg.train, 1)
    final_step = cfg.train.epochs * data.steps_per_epoch
    model = build_model(
        cfg.model, arrays.input_shape, arrays.num_outputs, task=arrays.task, inherited=inherited_model_keys(cfg.model)
    )
    probe = probe_examples(arrays)[0]
    name = loss_name(cfg.train, arrays.task)
    name = for_outputs(name, check_output(model, cfg.model.get("_target_"), name, arrays.num_outputs, arrays.task, probe)[0])
    model.compile(loss=build_loss(name), metrics=build_metrics(name, cfg.train.metrics))
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, step=step)
    directory = layout.checkpoint_dir(cfg)
    # Under the localhost launcher the metrics go into the job's run; elsewhere only to this task's log.
    attached = cfg.mlflow.enabled and os.environ.get(contract.ATTACH_RUN) not in (None, "", contract.NO_RUN)
    context = mlflow_run(cfg, trains=False) if attached else contextlib.nullcontext(NullRun())
    log.info("%s: evaluating checkpoints in %s until step %d", cluster.task, directory, final_step)
    state = tf.train.get_checkpoint_state(directory)  # an earlier attempt's (resume=): only its newest, as before
    results, done = {}, {str(p) for p in (state.all_model_checkpoint_paths[:-1] if state else [])}
    with context as run:
        for latest in tf.train.checkpoints_iterator(directory):  # polls: the newest one, as it appears
            for path in _not_evaluated(tf, directory, latest, done):  # and any written since the last poll
                done.add(path)
                try:
                    checkpoint.restore(path).expect_partial()
                except (tf.errors.NotFoundError, ValueError):  # removed by checkpoint.max_to_keep meanwhile
                    log.warning("%s: %s was removed before it could be evaluated", cluster.task, path)
                    continue
                results = model.evaluate(data.eval_dataset(), return_dict=True, verbose=0)
                metrics = {f"sidecar/eval_{k}": float(v) for k, v in results.items()}
                run.log_metrics(metrics, int(step.numpy()))
                run.flush()
                shown = ", ".join(f"{k}={v:.4f}" for k, v in metrics.items())
                log.info("%s: step %d %s", cluster.task, int(step.numpy()), shown)
            if int(step.numpy()) >= final_step:
                break
    return results


def _not_evaluated(tf, directory: str, latest: str, done: set) -> list[str]:
    """The checkpoints of `directory` not evaluated yet, oldest first, up to `latest`: checkpoints_iterator yields
    only the newest at each poll, and two can be written between polls."""
    state = tf.train.get_checkpoint_state(directory)
    paths = [str(p) for p in (state.all_model_checkpoint_paths if state else [])]
    paths = paths[: paths.index(latest) + 1] if latest in paths else [*paths, latest]
    return [p for p in paths if p not in done]
