"""Model.fit for a Keras 3 model (`import keras`): Keras 3's own compile/fit around the custom loop's replica step.

The tf_keras fit wraps the model in a tf_keras.Model (runner.executors.fit), which cannot hold Keras 3 layers. Here
a keras.Model subclass overrides `train_step` (supported by Keras 3's TensorFlow backend) with the custom loop's
replica step (runner.executors.replica_step: per-example losses over the global batch, the Keras 3 optimizer and
schedule, train.accumulation_steps), so fit's update is the custom loop's, which tests/e2e/test_keras3.py checks
against the default strategy's weights. Keras 3 averages a step's logs over the replicas; each replica's own loss
goes through a ShardLosses instead (one worker only: multi-worker fit is refused, runner.builders.keras_flavor).
The loss and train.metrics are tf_keras metric objects, as in the custom loop (Keras 3's Mean does not average
replicas right under every strategy), updated in the step and read on the host when they are logged; the model
resets them at each epoch's start, as Keras resets its own.
Evaluation is the custom loop's (runner.executors.evaluation.make_evaluator), not Keras' evaluate.
"""

from runner import tf_private
from runner.builders.metrics import reset, results
from runner.control import teardown
from runner.executors.base import Job
from runner.executors.evaluation import make_evaluator
from runner.executors.replica_step import make_replica_step


def keras3_model(job: Job, per_example_loss, shard_losses, own):
    """The model Keras 3's fit trains: job.model's variables, the custom loop's step. Make it in strategy.scope()
    (Keras 3 takes the strategy it is made in). `own`: train.metrics' tf_keras objects; `shard_losses`: a
    ShardLosses, made outside the scope."""
    import keras
    import tf_keras

    tf_private.NoSymbolicBuild.check()
    replicas = job.replicas
    step = make_replica_step(job, per_example_loss, with_shard=True, metrics=own, keras3=True)
    epoch_loss = tf_keras.metrics.Mean(name="loss")  # the epoch's mean loss so far, as fit logs it
    tracked = [epoch_loss, *own]

    class ReplicaLossModel3(tf_private.NoSymbolicBuild, keras.Model):
        """ReplicaLossModel's Keras 3 sibling (runner.executors.fit): the same methods the callbacks call."""

        def __init__(self):
            super().__init__(name="replica_loss_model")
            self.inner = job.model

        def call(self, inputs, training=None):
            return self.inner(inputs, training=training)

        def replica_losses(self, logs):
            """Every replica's shard loss at the last step, in replica order."""
            return shard_losses.read()

        def logged(self, logs):
            """The epoch's mean loss and train.metrics so far, read on the host (read inside the step, a tf_keras
            result() merges the replicas at every step, and under CentralStorageStrategy fit logged a loss of 0)."""
            return results(tracked)

        def reset_metrics(self):
            super().reset_metrics()
            reset(tracked)

        def train_step(self, data):
            share, shard = step(data)
            shard_losses.write(shard[0])
            loss = share * replicas  # Keras averages a step's logs over the replicas; their shares add up to its loss
            epoch_loss.update_state(loss)
            return {"loss": loss}

    return ReplicaLossModel3()


def keras3_evaluator(job: Job, per_example_loss):
    """evaluate() -> {'eval/loss': ..., ...}: the custom loop's evaluation over the eval split."""
    import tensorflow as tf

    update, found = make_evaluator(job, per_example_loss)
    strategy = job.strategy

    @tf.function
    def eval_step(inputs):
        strategy.run(update, args=(inputs,))

    def evaluate() -> dict[str, float]:
        for batch in teardown.keep(iter(job.data.distributed_eval(strategy))):
            eval_step(batch)
        return found()

    return evaluate
