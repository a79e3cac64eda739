"""Gradient accumulation (train.accumulation_steps = k): one update from k micro-batches of a replica's batch.

Each replica's share of the global batch is cut into at most k consecutive slices of ceil(n / k) examples; each slice
runs forward and backward on its own (the activations of one slice are alive at a time, so a batch k times larger
fits), the gradients are summed, and the optimizer applies them once. The data pipeline, the step count and the
checkpoints do not change: an update still takes one global batch from the input, so k only changes memory and time,
and the losses, divided by the whole global batch as before, give the update of the unaccumulated step. Not for
BatchNormalization: each micro-batch normalises with its own statistics and moves the averages once
(`warn_batch_norm`).

Shared by the custom loop's replica step (and the parameter-server coordinator's, which runs it) and Model.fit's
train step.
"""


def accumulated(k: int, batch, step):
    """Sum `step(micro_batch, fraction)` over the slices of `batch` (a nested structure of tensors whose first axis is
    the examples). `step` returns (gradients, extras): gradients a list with None for a variable that gets none,
    extras a tuple of float32 scalars; fraction is the slice's share of the batch's examples. Returns the summed pair."""
    if k == 1:
        return step(batch, 1.0)
    import tensorflow as tf

    # Left to AutoGraph (not do_not_convert): a user's model with tensor-dependent Python in call() is converted
    # inside the loop as it is without accumulation.
    def run():
        n = tf.shape(tf.nest.flatten(batch)[0])[0]
        size = tf.maximum((n + k - 1) // k, 1)
        pieces = (n + size - 1) // size  # no empty slice: a replica's batch below k examples makes fewer

        def piece(i):
            lo, hi = i * size, tf.minimum((i + 1) * size, n)
            part = tf.nest.map_structure(lambda t: t[lo:hi], batch)
            return step(part, tf.cast(hi - lo, tf.float32) / tf.cast(n, tf.float32))

        # The first slice outside the loop: the layers are built, and which variables get a gradient is known.
        grads, extras = piece(0)
        kept = [j for j, g in enumerate(grads) if g is not None]

        def body(i, sums, totals):
            more, extra = piece(i)
            return (
                i + 1,
                [s + tf.convert_to_tensor(more[j]) for s, j in zip(sums, kept)],
                tuple(a + b for a, b in zip(totals, extra)),
            )

        # One slice at a time (parallel_iterations=1): the slices only depend on the counter, and running several at
        # once would keep their activations alive together, the memory accumulation is there to save.
        _, sums, extras = tf.while_loop(
            lambda i, *_: i < pieces,
            body,
            (tf.constant(1), [tf.convert_to_tensor(grads[j]) for j in kept], extras),
            parallel_iterations=1,
        )
        out = [None] * len(grads)
        for s, j in zip(sums, kept):
            out[j] = s
        return out, tuple(extras)

    return run()


def warn_batch_norm(model, k: int) -> None:
    """One warning when k > 1 meets BatchNormalization layers, whose update then differs from the whole batch's."""
    if k == 1:
        return
    import logging

    from runner import tf_private

    found = [layer.name for layer in tf_private.all_layers(model) if "BatchNormalization" in type(layer).__name__]
    if found:
        logging.getLogger("runner").warning(
            "train.accumulation_steps=%d with %d BatchNormalization layer(s) (%s): each micro-batch is normalised with "
            "its own statistics and moves the moving averages once, so the update is not the whole batch's",
            k,
            len(found),
            ", ".join(found[:3]) + (", ..." if len(found) > 3 else ""),
        )
