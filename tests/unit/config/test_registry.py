"""The options' registry, in-process and fast: defaults live in one place, every option has its YAML and its schema,
the --help section is generated from the registry, pure validation touches nothing, and config-only modules load
no TensorFlow."""

import dataclasses
import inspect
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from hydra.core.config_store import ConfigStore
from hydra.utils import get_method
from omegaconf import OmegaConf

from runner.config import fields, helptext, registry, schema, validate
from runner.errors import ConfigError

from helpers import ROOT, composed

schema.register()
OmegaConf.register_new_resolver("runner.or", lambda a, b: a or b, replace=True)
CONF = ROOT / "conf"


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("group", list(registry.GROUPS))
def test_every_option_has_one_yaml_that_only_selects_its_schema(group):
    """conf/<group>/<name>.yaml exists for each registered option (and no other), and restates no default."""
    on_disk = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    assert on_disk == sorted(registry.options(group)), "register the option in its builder module and add its YAML"
    for name in on_disk:
        assert _yaml(CONF / group / f"{name}.yaml") == {"defaults": [f"/schema/{group}/{name}@_here_", "_self_"]}, (
            f"conf/{group}/{name}.yaml sets values: defaults belong in its schema ({registry.get(group, name).schema.__name__})"
        )


def test_the_root_config_restates_no_default():
    assert set(_yaml(CONF / "config.yaml")) <= {"defaults", "hydra"}, "plain nodes' defaults belong in runner/config/schema.py"


def test_the_composed_defaults_are_the_schemas():
    cfg = composed()
    for key in ("devices", "train", "mlflow", "checkpoint"):
        kind = OmegaConf.get_type(cfg[key])
        assert cfg[key] == OmegaConf.structured(kind), key
    for group in registry.GROUPS:
        for name, opt in registry.options(group).items():
            node = composed(f"{group}={name}")[group]
            assert OmegaConf.get_type(node) is opt.schema
            assert node == OmegaConf.structured(opt.node()), f"{group}={name}"
    assert cfg.train.optimizer.learning_rate == 0.05  # the value users got before the defaults were merged


@pytest.mark.parametrize("path", sorted((CONF / "model").glob("*.yaml")), ids=lambda p: p.stem)
def test_model_yaml_arguments_match_the_functions_defaults(path):
    """A model's YAML is its config (MLflow logs it); the function's own defaults must say the same."""
    spec = _yaml(path)
    params = inspect.signature(get_method(spec.pop("_target_"))).parameters
    for key, value in spec.items():
        default = params[key].default
        assert (list(default) if isinstance(default, tuple) else default) == value, f"{path.name}: {key}"


def test_the_config_store_holds_exactly_the_registry():
    repo = ConfigStore.instance().repo["schema"]
    for group in registry.GROUPS:
        stored = sorted(name[: -len(".yaml")] for name in repo[group])
        assert stored == sorted(registry.options(group)) == sorted(schema.GROUP_SCHEMAS[group])


def test_capabilities_name_registered_options():
    ops = set(registry.options("cross_device_ops"))
    inputs = fields.choices(registry.get("data", "ones").schema.__dataclass_fields__["input"].metadata["choices"])
    for s in registry.options("strategy").values():
        assert set(s.caps.cross_device_ops) <= ops and "auto" in s.caps.cross_device_ops, s.name
        assert s.caps.inputs is None or set(s.caps.inputs) <= set(inputs), s.name
    with pytest.raises(TypeError, match="unknown capabilities"):
        registry.register("strategy", "typo", schema=object, help="", cross_device_op=("auto",))


def test_every_choice_field_defaults_to_one_of_its_values():
    kinds = {o.schema for g in registry.GROUPS for o in registry.options(g).values()}
    kinds |= {schema.TrainConfig, schema.OptimizerConfig, schema.VariablePartitionerConfig}
    found = 0
    for kind in kinds:
        hints = typing.get_type_hints(kind)
        for f in dataclasses.fields(kind):
            if "choices" in f.metadata:
                found += 1
                typed = typing.Any if f.metadata.get("or_target") else str  # a name, or your own {_target_: ...}
                assert hints[f.name] is typed and f.default in fields.choices(f.metadata["choices"]), f"{kind.__name__}.{f.name}"
    assert found >= 6  # optimizer, loss, data.input, data.task (x2), verbose, partitioner kind


def test_the_help_section_is_rendered_from_the_registry():
    template = composed(hydra=True).hydra.help.template
    assert helptext.render().rstrip("\n") in template
    assert "data=function" not in template.split("== Config groups")[0]  # the section, once, under its heading


def test_the_help_names_every_plain_node():
    plain = yaml.safe_load((CONF / "hydra/help/runner.yaml").read_text())["template"].split("== Plain config nodes")[1]
    for f in dataclasses.fields(schema.RunnerConfig):
        if f.name not in registry.GROUPS and f.name != "model":
            assert f"\n{f.name} " in plain, f"{f.name} is missing from the --help template"


def test_an_unregistered_option_is_refused_naming_the_registered_ones():
    cfg = composed()
    cfg.strategy.name = "mirored"
    with pytest.raises(ConfigError, match="strategy=mirored is unknown; choose one of: default, one_device, mirrored"):
        validate.check_config(cfg)


def test_pure_checks_do_no_io(tmp_path):
    """check_config reads only the config: no files, sockets, environment or machine state (preflight does those)."""
    import builtins
    import contextlib
    import os
    import socket
    import urllib.request
    from unittest import mock

    cases = [
        composed(),
        composed("data=npz", "data.path=/no/such.npz"),
        composed("mlflow.tracking_uri=http://127.0.0.1:9"),
        composed("strategy=multi_worker_mirrored", "cluster=tf_config"),
        composed(f"checkpoint.dir={tmp_path}/x"),
        composed(f"resume={tmp_path}/none"),
    ]
    validate.check_config(cases[0])  # the registry's modules are imported before anything is forbidden
    touched = []

    def forbidden(*args, **kwargs):
        touched.append(args)
        raise AssertionError("I/O in a pure check")

    class NoEnviron(dict):
        def __getitem__(self, key):
            return forbidden(key)

        get = __contains__ = __getitem__

    targets = [
        (builtins, "open"),
        (socket, "socket"),
        (urllib.request, "urlopen"),
        (os, "mkdir"),
        (os, "stat"),
        (os, "listdir"),
        (os, "sched_getaffinity"),
        (os, "getenv"),
        (os.path, "exists"),
        (os.path, "isdir"),
        (os.path, "isfile"),
    ]
    with contextlib.ExitStack() as patches:
        for module, name in targets:
            patches.enter_context(mock.patch.object(module, name, forbidden))
        patches.enter_context(mock.patch.object(os, "environ", NoEnviron()))
        for cfg in cases:
            try:
                validate.check_config(cfg)
            except AssertionError:
                pass
    assert not touched, touched


def test_validate_runs_the_probes_after_the_pure_checks():
    with pytest.raises(ConfigError, match="/no/such.npz"):
        validate.validate(composed("data=npz", "data.path=/no/such.npz"))
    with pytest.raises(ConfigError, match="train.epochs=0"):  # pure first, though the file is missing too
        validate.validate(composed("data=npz", "data.path=/no/such.npz", "train.epochs=0"))


def test_config_only_modules_import_no_tensorflow_or_numpy():
    probe = (
        "import sys, runner.config.schema, runner.config.validate, runner.config.helptext, runner.config.layout\n"
        "import runner.preflight.needs\n"
        "runner.config.schema.register()\n"
        "print(sorted(m for m in ('tensorflow', 'tf_keras', 'numpy', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
