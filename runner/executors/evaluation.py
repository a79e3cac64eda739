"""Evaluation shared by the executors: the metrics a custom loop updates per replica, and evaluation on the
parameter-server coordinator (used by both the custom loop and Model.fit under parameter_server)."""

from runner.executors.base import Job


def make_evaluator(job: Job, per_example_loss):
    """(update(batch) to run per replica, results() -> {'eval/loss': ..., 'eval/accuracy': ...}). The metrics are
    tf_keras' whatever the model's Keras (they only see tensors; Keras 3's Mean under CentralStorageStrategy does not
    average the replicas' updates right)."""
    import tf_keras

    from runner.builders.metrics import build_metrics

    with job.strategy.scope():
        mean_loss = tf_keras.metrics.Mean(name="loss")
        metrics = build_metrics(job.loss, job.metrics)

    def update(inputs):
        x, y = inputs[0], inputs[1]
        logits = job.model(x, training=False)
        mean_loss.update_state(per_example_loss(y, logits))
        for metric in metrics:
            metric.update_state(y, logits)

    def results():
        """The figures since the last call (each evaluation after an epoch starts afresh)."""
        found = {f"eval/{m.name}": float(m.result()) for m in [mean_loss, *metrics]}
        for m in [mean_loss, *metrics]:
            m.reset_state()
        return found

    return update, results


def evaluate_on_coordinator(job: Job, evaluator=None) -> dict:
    """parameter_server: Model.evaluate would schedule a finite dataset on the workers (OutOfRange at its end);
    evaluate here instead, reading the variables from the ps tasks. `evaluator`: make_evaluator's pair, made here
    when not given."""
    if evaluator is None:
        import tf_keras

        from runner.builders.loss import build_loss

        evaluator = make_evaluator(job, build_loss(job.loss, tf_keras.losses.Reduction.NONE))
    update, results = evaluator
    for batch in job.data.eval_dataset():
        update(batch)
    return results()
