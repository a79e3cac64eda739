"""A search's space from `hydra.sweeper.params` and the command line's sweeps, in Hydra's own override grammar (read
by Hydra's public parser), as Optuna distributions:

    choice(a, b, c) or a,b,c   -> CategoricalDistribution
    range(start, stop, step)   -> IntDistribution (FloatDistribution with a step for floats); shuffle(...): categorical
    interval(low, high)        -> FloatDistribution; tag(int, interval(...)): IntDistribution; tag(log, ...): log scale
    any other value            -> fixed: the same override in every trial

ConfigError (exit 2) names the key for a sweep Optuna cannot sample (an empty choice, a glob, a range that holds no
value, a log scale that reaches 0).
"""

from dataclasses import dataclass, field

from runner.errors import ConfigError


@dataclass
class Space:
    distributions: dict = field(default_factory=dict)  # key -> an Optuna distribution
    fixed: dict = field(default_factory=dict)  # key -> the override's value as typed

    def overrides(self, params: dict) -> list[str]:
        """A trial's overrides: its sampled values, then the fixed ones."""
        return [f"{k}={_text(v)}" for k, v in params.items()] + [f"{k}={v}" for k, v in self.fixed.items()]

    def grid(self) -> dict:
        """Every key's values for Optuna's GridSampler (choices and ranges only)."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        values = {}
        for key, d in self.distributions.items():
            if isinstance(d, CategoricalDistribution):
                values[key] = list(d.choices)
            elif isinstance(d, (IntDistribution, FloatDistribution)) and d.step is not None and not d.log:
                count = int(round((d.high - d.low) / d.step)) + 1
                values[key] = [d.low + i * d.step for i in range(count)]
            else:
                raise ConfigError(
                    f"hydra.sweeper.params.{key} is a continuous interval, and hydra/sweeper/sampler=grid tries each value "
                    f"of a finite set: give it as choice(...) or range(start, stop, step), or use another sampler "
                    "(tpe, random, cmaes)."
                )
        return values


def _text(value) -> str:
    """A sampled value as Hydra reads it back (a float's repr, not a rounded str)."""
    return repr(value) if isinstance(value, float) else str(value)


def _problem(key: str, text: str, why: str) -> ConfigError:
    return ConfigError(f"hydra.sweeper.params.{key}={text}: {why}. Use choice(a, b), range(start, stop, step), "
                       "interval(low, high) or tag(log, interval(low, high)), as with Hydra's Optuna sweeper.")  # fmt: skip


def _distribution(override):
    from hydra.core.override_parser.types import Transformer
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    key, text = override.get_key_element(), str(override.input_line).split("=", 1)[-1]
    value = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        choices = list(override.sweep_iterator(transformer=Transformer.encode))
        if not choices:
            raise _problem(key, text, "an empty choice")
        return CategoricalDistribution(choices)
    if override.is_range_sweep():
        start, stop, step = value.start, value.stop, value.step
        if any(isinstance(x, float) for x in (start, stop, step)):
            values = list(override.sweep_iterator())
            if not values:
                raise _problem(key, text, "a range that holds no value")
            return FloatDistribution(float(values[0]), float(values[-1]), step=float(step))
        last = stop - step if step > 0 else None  # range() stops before `stop`, as Python's
        if last is None or last < start:
            raise _problem(key, text, "a range that holds no value")
        return IntDistribution(int(start), int(start + (last - start) // step * step), step=int(step))
    if override.is_interval_sweep():
        low, high, log = value.start, value.end, "log" in value.tags
        if not low < high:
            raise _problem(key, text, f"an interval whose low end ({low}) is not below its high end ({high})")
        if log and low <= 0:
            raise _problem(key, text, "a log scale needs a low end above 0")
        if "int" in value.tags:  # Hydra reads an interval's ends as floats: tag(int, interval(1, 8)) for integers
            if low != int(low) or high != int(high):
                raise _problem(key, text, "tag(int, ...) needs whole-number ends")
            return IntDistribution(int(low), int(high), log=log)
        return FloatDistribution(float(low), float(high), log=log)
    raise _problem(key, text, "a sweep Optuna cannot sample (a glob over a config group?)")


def parse(params: dict | None, arguments: list[str]) -> Space:
    """The space of `hydra.sweeper.params` plus the command line's overrides (the command line wins on a key)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    texts = [f"{k}={v}" for k, v in (params or {}).items()] + list(arguments)
    space = Space()
    for override in OverridesParser.create().parse_overrides(texts):
        key = override.get_key_element()
        space.distributions.pop(key, None)
        space.fixed.pop(key, None)
        if override.is_sweep_override():
            space.distributions[key] = _distribution(override)
        else:
            space.fixed[key] = override.get_value_element_as_str()
    return space
