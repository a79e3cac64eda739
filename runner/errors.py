"""Errors a user can act on: printed as one message, never as a TensorFlow stack trace."""


class ConfigError(Exception):
    """A config value (or the machine it runs on) cannot work; the message says what to use instead."""

    exit_code = 2
