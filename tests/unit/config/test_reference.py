"""runner/config/reference.py: docs/reference/config.md is the page the schemas generate today, and it lists every
key a run's config has (as OmegaConf composes it, not as the generator reads the source), each with what it does."""

import re
from pathlib import Path

from omegaconf import OmegaConf

from runner.config import reference, registry, schema

import helpers

schema.register()
ROOT = Path(__file__).resolve().parents[3]
KEY = re.compile(r"^\| `([^`]+)` \| `[^`]*` \| [^|]* \| (?:[^|\\]|\\\|)* \| (.*) \|$")


def _page() -> str:
    return (ROOT / reference.PAGE).read_text()


def _keys(node, prefix="") -> set[str]:
    """Dotted keys of a config's nodes, down to the values (a `kwargs` node is one key: it is assigned whole)."""
    if not isinstance(node, dict):
        node = OmegaConf.to_container(node, resolve=False)
    found = set()
    for key, value in node.items():
        if isinstance(value, dict) and key != "kwargs":
            found |= _keys(value, f"{prefix}{key}.")
        else:
            found.add(f"{prefix}{key}")
    return found


def test_the_page_is_what_the_schemas_generate_today():
    assert _page() == reference.render(), (
        f"{reference.PAGE} is stale: run `python -m runner.config.reference > {reference.PAGE}` and commit it"
    )


def test_every_key_of_a_composed_config_and_of_every_option_is_listed_with_what_it_does():
    rows = {}
    for line in _page().splitlines():
        match = KEY.match(line)
        if match:
            rows.setdefault(match.group(1), []).append(match.group(2).strip())
    cfg = helpers.composed()
    groups = ("strategy", "cross_device_ops", "cluster", "data", "executor")
    wanted = {k for k in _keys(cfg) if k.split(".")[0] not in (*groups, "model") and not k.startswith("hydra")}
    for group in groups:
        for option in registry.options(group).values():
            node = OmegaConf.structured(option.node())
            wanted |= {k for k in _keys(node, f"{group}.") if k != f"{group}.name"}
    missing = sorted(wanted - set(rows))
    assert not missing, f"keys the reference does not list: {missing}"
    silent = sorted(k for k, texts in rows.items() if not all(texts))
    assert not silent, f"keys listed without what they do (a comment above or beside the field says it): {silent}"
    assert "train.steps_per_execution" in rows and "cluster.elastic.rejoin_after_sec" in rows


def test_exit_codes_are_listed_from_the_error_classes():
    from runner import errors

    page = _page()
    for cls in (errors.ConfigError, errors.ClusterError, errors.TrainingError, errors.DataError):
        assert f"| {cls.exit_code} | `{cls.__name__}` |" in page
