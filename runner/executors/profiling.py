"""train.profile_steps=[first, last]: a TensorFlow profiler trace of those training steps (1-based, inclusive),
for both executors, written to <output_dir>/profile and logged as the run's `profile` artifact. Open it with
TensorBoard's profile plugin: `pip install -e ".[profile]"` (tensorboard and xprof), then README's tensorboard command.

The trace starts before the call that runs step `first` and stops after the call that ran step `last` (a call runs
train.steps_per_execution or train.steps_per_loop steps). On a parameter-server coordinator it shows the
coordinator's side only: the workers' steps run in their own processes.
"""

import logging
import os

log = logging.getLogger("runner")


class Profile:
    def __init__(self, steps, output_dir: str | None):
        self.first, self.last = (int(steps[0]), int(steps[1])) if steps else (0, 0)
        self.dir = os.path.join(output_dir, "profile") if output_dir else None
        self.active = self.done = False

    @property
    def wanted(self) -> bool:
        return bool(self.first) and self.dir is not None and not self.done

    def before(self, step: int, n: int = 1) -> None:
        """Steps step .. step+n-1 are about to run."""
        if self.wanted and not self.active and step <= self.last and step + n - 1 >= self.first:
            self._start()
            self.active = True
            log.info("profiling steps %d-%d to %s", max(step, self.first), self.last, self.dir)

    def after(self, step: int) -> None:
        """Every step up to `step` has run."""
        if self.active and step >= self.last:
            self.stop()

    def stop(self) -> None:
        if self.active:
            self._stop()
            self.active, self.done = False, True

    def _start(self) -> None:
        import tensorflow as tf

        tf.profiler.experimental.start(self.dir)

    def _stop(self) -> None:
        import tensorflow as tf

        tf.profiler.experimental.stop()

    def log_to(self, run) -> None:
        """End a trace still running (training ended inside the window), then log it as the `profile` artifact."""
        self.stop()
        if not self.first or self.dir is None:
            return
        if not self.done:
            log.warning(
                "train.profile_steps=[%d, %d]: training never ran those steps (it resumed past them, or has fewer); no trace",
                self.first,
                self.last,
            )
            return
        run.log_artifact(self.dir, "profile")
