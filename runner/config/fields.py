"""Schema field helpers: a field's default, declared once, beside its valid range or its valid choices.

Defaults live only in the schema dataclasses (runner.config.schema and the option schemas in runner/builders/); the
YAML files in conf/ select options and override values but never restate a default (tests/unit/config/test_registry.py fails
if one does). runner.config.validate checks every declared range and choice with one generic walk each.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

UINT32_MAX = 2**32 - 1  # numpy's and Python's random.seed take seeds up to this


@dataclass(frozen=True)
class Range:
    """Bounds of one numeric field (None: unbounded). For a list field they apply to each element."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    null: str | None = None  # what null means, for Optional fields (said in the message)
    why: str = ""  # what the bound protects against or what to do, appended to the message


def ranged(default=None, *, factory=None, **bounds) -> Any:
    """A dataclass field with a default and its valid range: `seed: int = ranged(0, ge=0, le=UINT32_MAX)`."""
    if factory is not None:
        return field(default_factory=factory, metadata={"range": Range(**bounds)})
    return field(default=default, metadata={"range": Range(**bounds)})


def choice(kind: type[Enum], default, target: bool = False) -> Any:
    """A string field whose value must be one of the values of the Enum `kind`: `loss: str = choice(Loss, "auto")`.

    The field stays a plain `str` for Hydra on purpose: typed as the Enum, Hydra would refuse a bad value while
    composing (exit 1, its own message, before any runner code), and the runner's contract is one readable paragraph
    with exit 2 that names the valid values (tests/e2e/test_errors.py, tests/unit/config/test_config.py).
    `validate.check_config` checks the value against `kind`; the Enum is the one list of valid values, which the builders use too.

    With `target=True` the field may instead hold a node with `_target_` (your own object, as Hydra instantiates
    one: train.loss), so it is typed `Any`; runner.config.validate checks that node's shape.
    """
    metadata = {"choices": kind, "or_target": True} if target else {"choices": kind}
    return field(default=kind(default).value, metadata=metadata)


def choices(kind: type[Enum]) -> tuple:
    """The valid values of a choice field's Enum, in declaration order."""
    return tuple(member.value for member in kind)
