"""data=ones, synthetic, digits, npz: sources held in memory as NumPy arrays (runner.sources.in_memory makes them),
fed through `pipeline.Data`. Each registers its schema, loader and capabilities here; its YAML is conf/data/<name>.yaml.
"""

import os
from dataclasses import dataclass

from omegaconf import MISSING

from runner.builders.data.pipeline import DataConfig, Task
from runner.config.fields import UINT32_MAX, choice, ranged
from runner.config.registry import register
from runner.errors import ConfigError


@dataclass
class OnesDataConfig(DataConfig):
    # training examples
    num_examples: int = ranged(100, ge=1)
    # evaluation examples
    eval_examples: int = ranged(100, ge=1)


@dataclass
class SyntheticDataConfig(DataConfig):
    # classification: integer labels; regression: real-valued targets
    task: str = choice(Task, "classification")
    # training examples
    num_examples: int = ranged(4096, ge=1)
    # evaluation examples, drawn apart from the training ones
    eval_examples: int = ranged(1024, ge=1)
    # features per example
    num_features: int = ranged(20, ge=1)
    # classes (classification) or targets (regression)
    num_classes: int = ranged(4, ge=2, why="classification needs two classes or more")
    # standard deviation of the Gaussian noise added to the linear map
    noise: float = ranged(0.1, ge=0)
    # seed of the generated data, or of which examples eval_fraction holds out
    seed: int = ranged(0, ge=0, le=UINT32_MAX)


@dataclass
class DigitsDataConfig(DataConfig):
    # the share of the examples held out for evaluation
    eval_fraction: float = ranged(0.2, gt=0, lt=1)
    # seed of the generated data, or of which examples eval_fraction holds out
    seed: int = ranged(0, ge=0, le=UINT32_MAX)


@dataclass
class NpzDataConfig(DataConfig):
    # the .npz file (np.savez): its arrays are named by the keys below
    path: str = MISSING
    # classification: integer labels; regression: real-valued targets
    task: str = choice(Task, "classification")
    # the file's array of training features
    x_train: str = "x_train"
    # the file's array of training labels
    y_train: str = "y_train"
    x_eval: str = "x_eval"  # when absent from the file, eval_fraction of the training arrays is held out
    # the file's array of evaluation labels
    y_eval: str = "y_eval"
    # the share of the examples held out for evaluation
    eval_fraction: float = ranged(0.2, gt=0, lt=1)
    # seed of the generated data, or of which examples eval_fraction holds out
    seed: int = ranged(0, ge=0, le=UINT32_MAX)


def _loader(name: str):
    """The source's loader in runner.sources.in_memory (NumPy: imported when loading, not by config-only commands)."""

    def load(cfg):
        from runner.sources import in_memory

        return getattr(in_memory, name)(cfg)

    return load


def _npz_file_exists(cfg):
    path = os.path.expanduser(str(cfg.data.path))
    if not os.path.isfile(path):
        raise ConfigError(
            f"data.path={cfg.data.path!r}: no such file (looked in {os.path.abspath(path)}). "
            "Point data.path at a .npz file with arrays x_train and y_train."
        )


register(
    "data",
    "ones",
    schema=OnesDataConfig,
    help="the guide's from_tensors(([1.], [1.])), repeated",
    build=_loader("ones"),
    example_bytes=lambda cfg: 4 + 4,
    generates=1,
)
register(
    "data",
    "synthetic",
    schema=SyntheticDataConfig,
    help="seeded Gaussian features, labels from a linear map",
    build=_loader("synthetic"),
    example_bytes=lambda cfg: 4 * cfg.num_features + 4,
    generates=3,
)  # drawn in float64, then cast: `generates` is the peak memory per example while made
register(
    "data",
    "digits",
    schema=DigitsDataConfig,
    help="scikit-learn's 8x8 digits",
    build=_loader("digits"),
    example_bytes=lambda cfg: 4 * 64 + 4,
)
register("data", "npz", schema=NpzDataConfig, help="your own .npz file", build=_loader("npz"), probe=_npz_file_exists)
