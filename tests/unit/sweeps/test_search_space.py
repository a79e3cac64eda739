"""hydra/sweeper=optuna's search space (runner.sweeps.search_space) and its directions (runner.sweeps.search): Hydra's
Optuna-sweeper syntax read by Hydra's own parser into Optuna 5 distributions; what Optuna cannot sample is one
paragraph naming the key. No trials run here."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from runner.errors import ConfigError
from runner.sweeps.search import directions
from runner.sweeps.search_space import parse

from helpers import composed

TUNE_LR = dict(composed("experiment=tune_lr", hydra=True).hydra.sweeper.params)


def test_tune_lr_reads_as_hydras_optuna_sweeper_read_it():
    space = parse(TUNE_LR, [])
    d = space.distributions
    assert d["train.optimizer.learning_rate"] == FloatDistribution(0.001, 0.5, log=True)
    assert d["train.optimizer.weight_decay"] == FloatDistribution(0.00001, 0.01, log=True)
    assert d["train.optimizer.schedule.warmup_steps"] == CategoricalDistribution([0, 10, 50])
    assert d["train.global_batch_size"] == CategoricalDistribution([32, 64, 128])
    assert space.fixed == {}


def test_ranges_intervals_fixed_values_and_the_command_line():
    space = parse(
        {"a": "range(1, 10, 3)", "b": "interval(0, 1)", "c": "tag(int, interval(2, 8))", "d": "7", "e": "range(0.0, 1.0, 0.25)"},
        ["b=choice(x,y)", "strategy=mirrored", "+model.alpha=shuffle(range(1,3))"],
    )
    d = space.distributions
    assert d["a"] == IntDistribution(1, 7, step=3)  # range() stops before its stop, as Python's
    assert d["b"] == CategoricalDistribution(["x", "y"])  # the command line wins over hydra.sweeper.params
    assert d["c"] == IntDistribution(2, 8)
    assert d["e"] == FloatDistribution(0.0, 0.75, step=0.25)
    assert set(d["+model.alpha"].choices) == {1, 2}
    assert space.fixed == {"d": "7", "strategy": "mirrored"}
    assert space.overrides({"a": 4, "b": "x"}) == ["a=4", "b=x", "d=7", "strategy=mirrored"]
    assert space.grid()["a"] == [1, 4, 7] and space.grid()["e"] == [0.0, 0.25, 0.5, 0.75]


@pytest.mark.parametrize(
    "text,says",
    [
        ("range(5, 5)", "a range that holds no value"),
        ("interval(1, 1)", "an interval whose low end (1.0) is not below its high end (1.0)"),
        ("tag(int, interval(0.5, 3))", "tag(int, ...) needs whole-number ends"),
        ("tag(log, interval(0, 1))", "a log scale needs a low end above 0"),
    ],
)
def test_what_optuna_cannot_sample_names_the_key(text, says):
    with pytest.raises(ConfigError) as err:
        parse({"train.optimizer.learning_rate": text}, [])
    message = str(err.value)
    assert message.startswith(f"hydra.sweeper.params.train.optimizer.learning_rate={text}: {says}") and "\n" not in message


def test_the_grid_sampler_refuses_a_continuous_interval():
    with pytest.raises(ConfigError, match=r"learning_rate is a continuous interval, and hydra/sweeper/sampler=grid"):
        parse(TUNE_LR, []).grid()


def test_one_direction_per_objective():
    assert directions({"direction": "maximize"}, ["eval/accuracy"]) == ["maximize"]
    assert directions({"direction": ["minimize", "maximize"]}, ["eval/loss", "summary/examples_per_sec"]) == [
        "minimize",
        "maximize",
    ]
    assert directions({"direction": "minimize"}, ["a", "b"]) == ["minimize", "minimize"]
    for bad, says in [("up", "'up' is not minimize or maximize"), (["minimize"] * 3, "3 direction(s) for 2 objective(s)")]:
        with pytest.raises(ConfigError, match=re_escape(says)):
            directions({"direction": bad}, ["a", "b"])


def re_escape(text):
    import re

    return re.escape(text)


@given(st.floats(1e-6, 1e3), st.floats(1.01, 1e3))
def test_a_sampled_float_reads_back_as_itself(low, factor):
    """The override a trial gets holds the sampled value exactly (repr, not a rounded str)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    value = low * factor
    (override,) = OverridesParser.create().parse_overrides(parse({}, []).overrides({"x": value}))
    assert math.isclose(override.value(), value, rel_tol=0, abs_tol=0)
