"""Errors a user can act on: printed as one message, never as a TensorFlow stack trace."""


class RunnerError(Exception):
    exit_code = 1
    # Raised before the first training step as a refusal of what the user gave: the run trained nothing, and an MLflow
    # run created for it is deleted rather than kept FAILED (runner.tracking.run.refused).
    trained_nothing = False


class ConfigError(RunnerError):
    """A config value (or the machine it runs on) cannot work; the message says what to use instead."""

    exit_code = 2
    trained_nothing = True


class ClusterError(RunnerError):
    """A task of a multi-process cluster died or never joined; the message names it."""

    exit_code = 3


class TrainingError(RunnerError):
    """Training went wrong (the loss became NaN or infinite); the last good checkpoint is kept."""

    exit_code = 4


class DataError(RunnerError):
    """The data broke while it was read during training or evaluation (a damaged record, a file cut short, a record
    unlike its spec); the message names the file where TensorFlow tells, and the last checkpoint is kept."""

    exit_code = 5


class UserCodeError(RunnerError):
    """Your own code (a `_target_`: a callback, a loss, a metric, a data function) raised during training; the
    message names its key, its error and where in your file, and the last checkpoint is kept."""

    exit_code = 6


class DataRefused(DataError):
    """data.verify found a damaged record before training: the file and record are named, nothing was trained."""

    trained_nothing = True


def chain(err: BaseException) -> list[BaseException]:
    """`err` and the errors it was raised from or during, outermost first."""
    seen = []
    while err is not None and all(err is not e for e in seen):
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def runners_own(err: BaseException) -> RunnerError | None:
    """The runner's own error (a stop, a refusal) in `err`'s chain: what a wrapper (user code, Hydra's instantiate)
    raised around it, else None."""
    return next((e for e in chain(err) if isinstance(e, RunnerError)), None)
