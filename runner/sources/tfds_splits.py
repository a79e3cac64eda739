"""tfds's split syntax, checked without TensorFlow: a split's name, a slice of one (train[:80%], train[10:-10]) or
several joined with +, and the number of examples each selects (from the sizes in dataset_info.json)."""

import re

from runner.errors import ConfigError

SPLIT = re.compile(r"^(\w+)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?$")  # a piece of tfds's split syntax: name, name[from:to]
EVAL_SPLITS = ("test", "validation")  # data.split_eval=null: the first the dataset has

QUOTED = "quoted twice on the command line, as Hydra reads [ as a list: data.split_train=\"'train[:80%]'\""


def _boundary(text: str | None, n: int, default: int) -> int:
    """One end of a slice as an example index: 10, -10, 80% or -20% (percents rounded to the closest, as tfds)."""
    if not text:
        return default
    value = round(n * int(text[:-1]) / 100) if text.endswith("%") else int(text)
    return n + value if value < 0 else value


def split_size(key: str, split: str, sizes: dict[str, int]) -> int:
    """The examples `split` selects: a split's name, a slice of one (train[:80%], train[10:-10]), or several joined
    with +. Every piece must name a split the dataset has, and select an example or more."""
    total = 0
    for piece in str(split).split("+"):
        match = SPLIT.match(piece.strip())
        if not match:
            raise ConfigError(
                f"{key}={split!r} is not a split the runner reads: a split's name ({', '.join(sizes)}), a slice of one "
                f"(train[:80%], train[100:]) or several joined with + ({QUOTED})."
            )
        name, start, stop = match.groups()
        if name not in sizes:
            raise ConfigError(f"{key}={split!r}: the dataset has no split {name!r}; its splits: {', '.join(sizes)}.")
        n = sizes[name]
        if any(t and t.endswith("%") and abs(int(t[:-1])) > 100 for t in (start, stop)):
            raise ConfigError(f"{key}={split!r}: a percent slice goes from -100% to 100%.")
        lo, hi = _boundary(start, n, 0), _boundary(stop, n, n)
        if not 0 <= lo <= n or not 0 <= hi <= n or hi - lo < 1:
            raise ConfigError(
                f"{key}={split!r}: {piece.strip()} selects no examples of the {n} in {name!r} (from {lo} to {hi}); "
                "choose a slice within the split."
            )
        total += hi - lo
    return total


def eval_split(cfg, splits: list[str]) -> str:
    if cfg.split_eval is not None:
        return cfg.split_eval
    found = [s for s in EVAL_SPLITS if s in splits]
    if not found:
        raise ConfigError(
            f"data.split_eval is null and the dataset has no {' or '.join(EVAL_SPLITS)} split (its splits: {', '.join(splits)}); "
            "name one, or hold part of the training split out: data.split_train=\"'train[:80%]'\" "
            "data.split_eval=\"'train[80%:]'\" (quoted twice: Hydra reads [ as a list)."
        )
    return found[0]


def examples(split: dict) -> int:
    """A split's size from dataset_info.json: its shards' lengths (tfds 4), else its statistics (older files)."""
    if "shardLengths" in split:
        return sum(int(n) for n in split["shardLengths"])
    return int(split.get("statistics", {}).get("numExamples", 0))
