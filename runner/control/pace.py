"""How often progress lines reach an output that is no terminal (a log file, a pipe, a sweep's or a launcher's output).

A fast run logging every `train.log_every_n_steps` steps would write hundreds of lines a second there. Paced, a line
is shown when at least `EVERY_SEC` passed since the last one shown, and the first and the last (the step training
ended on, early stopping too) are always shown.
`executor.verbose=2` shows every line. A task under a launcher prints every line (the launcher reads its steps from
them, runner.launch.localhost) and the launcher paces what it shows.
"""

import time

EVERY_SEC = 1.0


class Pace:
    def __init__(self, every_sec: float = EVERY_SEC, clock=time.monotonic):
        self.every_sec, self.clock, self.shown = every_sec, clock, None

    def due(self, last: bool = False) -> bool:
        """Whether this line is shown; `last`: the run's last step."""
        now = self.clock()
        if last or self.shown is None or now - self.shown >= self.every_sec:
            self.shown = now
            return True
        return False
