"""Errors a user can act on: printed as one message, never as a TensorFlow stack trace."""


class RunnerError(Exception):
    exit_code = 1


class ConfigError(RunnerError):
    """A config value (or the machine it runs on) cannot work; the message says what to use instead."""

    exit_code = 2


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
