"""One registry per config group: each option declares its schema, builder and capabilities in one place.

An option is declared once, in its group's module (GROUPS below), with `@option(group, name, ...)` on its builder
(or `register`). Hydra's ConfigStore (`schema.register`), the pure checks (`validate.check_config`), the pre-flight
probes (`needs.preflight`) and the --help text (`helptext`) all read it from here. Adding a strategy, cluster or
executor is one schema dataclass and one decorated builder in that module, plus one YAML file,
conf/<group>/<name>.yaml, that selects `/schema/<group>/<name>`. The data group is a package: a new data source is
a module of its own in runner.builders.data (found there, never listed) plus its YAML.

No TensorFlow here, and none at the top of the group modules: config-only commands load all of them.
"""

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from runner.errors import ConfigError

Check = Callable[..., None]  # fn(cfg) -> None, raising ConfigError


@dataclass(frozen=True)
class Capabilities:
    """What every option may declare: `check`, a pure cross-field check of the whole config, and `probe`, a
    pre-flight probe (files, network). They run only when the option is selected."""

    check: Check | None = None
    probe: Check | None = None


@dataclass(frozen=True)
class StrategyCapabilities(Capabilities):
    cross_device_ops: tuple[str, ...] = ("auto",)  # the cross_device_ops options it takes
    multi_process: bool = False  # may run as one task of a cluster of processes (a cluster with `processes`)
    inputs: tuple[str, ...] | None = None  # the data.input paths it supports (None: all of them)
    # fn(cfg, ops_cfg) -> [(key, device name)] the config names, checked to exist before the strategy is built (a
    # missing one hangs at the first step). Only single-process strategies: listing devices initialises TensorFlow.
    devices: Callable | None = None


@dataclass(frozen=True)
class ClusterCapabilities(Capabilities):
    processes: bool = False  # its tasks are separate processes: only `multi_process` strategies fit
    reads_tf_config: bool = False  # the TF_CONFIG environment variable describes it (probed before TensorFlow)
    # the module whose launch(cfg, chosen) starts the tasks from this process and supervises them (localhost, ray);
    # None: this process is one task of the cluster
    launcher: str | None = None
    # the launcher instead when cluster.elastic is on (slurm: one process that starts each worker as a job step)
    elastic_launcher: str | None = None


@dataclass(frozen=True)
class DataCapabilities(Capabilities):
    example_bytes: Callable | None = None  # fn(data cfg) -> bytes per example (x float32, then y), when the config tells
    generates: int = 0  # data made from the config: while made, an example takes example_bytes * generates
    # fn(data cfg, loaded source, train cfg, *, cluster, parameter_server) -> a `pipeline.StreamedData`, for a
    # source that builds its own tf.data pipeline (files, a user's dataset_fn); None: the in-memory pipeline of arrays
    pipeline: Callable | None = None


# group -> (the module that registers its options, the capabilities an option may declare)
GROUPS: dict[str, tuple[str, type[Capabilities]]] = {
    # strategy=auto; it imports runner.builders.strategy, which registers the rest
    "strategy": ("runner.builders.strategy_auto", StrategyCapabilities),
    "cross_device_ops": ("runner.builders.cross_device_ops", Capabilities),
    "cluster": ("runner.builders.cluster", ClusterCapabilities),
    "data": ("runner.builders.data", DataCapabilities),  # a package: every module in it may register data options
    "executor": ("runner.builders.executor", Capabilities),
}


@dataclass(frozen=True)
class Option:
    group: str
    name: str
    schema: type  # the dataclass Hydra types the option's node with
    build: Callable | None  # None: never built inside a task (cluster=localhost is started by the launcher)
    help: str  # what it builds, for --help
    caps: Capabilities  # the group's kind of Capabilities (GROUPS)

    def node(self):
        """The schema with the option's name filled in, as stored in Hydra's ConfigStore."""
        return self.schema(name=self.name)


_options: dict[str, dict[str, Option]] = {group: {} for group in GROUPS}
_intros: dict[str, str] = {}
_loaded: set[str] = set()


def register(group: str, name: str, *, schema: type, help: str, build: Callable | None = None, **caps) -> Option:
    kind = GROUPS[group][1]
    allowed = [f.name for f in dataclasses.fields(kind)]
    unknown = sorted(set(caps) - set(allowed))
    if unknown:
        raise TypeError(f"{group}={name}: unknown capabilities {unknown}; a {group} option may declare {sorted(allowed)}")
    registered = Option(group, name, schema, build, help, kind(**caps))
    _options[group][name] = registered
    return registered


def option(group: str, name: str, *, schema: type, help: str, **caps):
    """Decorator form of `register`: the decorated function is the option's builder."""

    def decorate(build: Callable) -> Callable:
        register(group, name, schema=schema, help=help, build=build, **caps)
        return build

    return decorate


def describe(group: str, intro: str) -> None:
    """What the group as a whole builds, for --help (declared in the group's module)."""
    _intros[group] = intro


def intro(group: str) -> str:
    options(group)
    return _intros.get(group, "")


def options(group: str) -> dict[str, Option]:
    """The group's options, in registration order (importing its module registers them; a package's modules are
    all imported, in name order, so that a new module there is all it takes to add an option)."""
    if group not in _loaded:
        module = importlib.import_module(GROUPS[group][0])
        for found in sorted(pkgutil.iter_modules(getattr(module, "__path__", [])), key=lambda m: m.name):
            importlib.import_module(f"{module.__name__}.{found.name}")
        _loaded.add(group)  # listed once: the pure checks read the options again and again, with no I/O
    return _options[group]


def get(group: str, name) -> Option:
    found = options(group).get(name)
    if found is None:
        raise ConfigError(f"{group}={name} is unknown; choose one of: {', '.join(options(group))}.")
    return found


def selected(cfg, group: str) -> Option:
    """The option the root config selects for `group`."""
    return get(group, cfg[group].name)
