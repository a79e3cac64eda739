"""An interpolation that cannot be resolved is one paragraph naming the key, what it holds and what to do."""

from dataclasses import dataclass

import pytest
from omegaconf import OmegaConf

from runner.config import interpolation


@dataclass
class Train:
    epochs: int = 1
    seed: int = 0


@pytest.mark.parametrize(
    "value, needles",
    [
        ("${train.seed_x}", ["train.epochs=${train.seed_x}", "refers to train.seed_x, which is no key of the config"]),
        (
            "${oc.env:RUNNER_TEST_UNSET}",
            ["reads the environment variable RUNNER_TEST_UNSET", "${oc.env:RUNNER_TEST_UNSET,<default>}"],
        ),
        ("${nores:1}", ["calls the resolver 'nores', which is not registered"]),
        ("${train.epochs}", ["an interpolation cycle"]),
        ("${oc.env:HOME}", ["could not be converted to Integer"]),
        ("${train.seed\u200b}", ["train.seed<U+200B>"]),
    ],
)
def test_each_kind_is_named(value, needles, monkeypatch):
    monkeypatch.delenv("RUNNER_TEST_UNSET", raising=False)
    monkeypatch.setenv("HOME", "/home/someone")
    typed = OmegaConf.structured({"train": Train})  # typed, as the schema is: a resolved value of the wrong type fails
    typed.train.epochs = value
    problem = interpolation.check(typed)
    assert problem is not None and problem.endswith("."), problem
    for needle in needles:
        assert needle in problem, problem


def test_a_config_that_resolves_has_no_problem():
    assert interpolation.check(OmegaConf.create({"a": 1, "b": "${a}"})) is None
