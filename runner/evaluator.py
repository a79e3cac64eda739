"""The evaluator task: side-car evaluation of each checkpoint the chief writes, as it appears.

It builds the same model without a strategy, restores each new checkpoint, evaluates on the eval split
and reports `sidecar/*` metrics at the checkpoint's step. It stops after the final step's checkpoint.
New checkpoints come from tf.train.checkpoints_iterator: it polls every second and, with no timeout, waits as
long as training runs; the end of training is the final step's checkpoint, seen here.
"""

import contextlib
import logging
import os

from runner import contract, datasets, layout
from runner.tracking import NullRun, mlflow_run

log = logging.getLogger("runner")


def evaluate_checkpoints(cfg, cluster) -> dict:
    import tensorflow as tf

    from runner.builders.data import build_data
    from runner.builders.model import build_loss, build_metrics, build_model, loss_name

    arrays = datasets.load(cfg.data)
    data = build_data(cfg.data, arrays, cfg.train, 1)
    final_step = cfg.train.epochs * data.steps_per_epoch
    model = build_model(cfg.model, arrays.input_shape, arrays.num_outputs)
    name = loss_name(cfg.train, arrays.task)
    model.compile(loss=build_loss(name), metrics=build_metrics(name))
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, step=step)
    directory = layout.checkpoint_dir(cfg)
    # Under the localhost launcher the metrics go into the job's run; elsewhere only to this task's log.
    context = mlflow_run(cfg) if os.environ.get(contract.ATTACH_RUN) else contextlib.nullcontext(NullRun())
    log.info("%s: evaluating checkpoints in %s until step %d", cluster.task, directory, final_step)
    results = {}
    with context as run:
        for latest in tf.train.checkpoints_iterator(directory):  # each new one, as it appears
            checkpoint.restore(latest).expect_partial()
            results = model.evaluate(data.eval_dataset(), return_dict=True, verbose=0)
            metrics = {f"sidecar/eval_{k}": float(v) for k, v in results.items()}
            run.log_metrics(metrics, int(step.numpy()))
            run.flush()
            log.info("%s: step %d %s", cluster.task, int(step.numpy()), ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
            if int(step.numpy()) >= final_step:
                break
    return results
