"""The config-group section of `python -m runner --help`, generated from the registry (runner/registry.py) and conf/.

Hydra's help template is a static string (conf/hydra/help/runner.yaml), so the section is written into it:
`python -m runner.helptext` rewrites it after an option is added or changed, and tests/test_registry.py fails while
the file and the registry disagree. Groups without a registry (model: any `_target_`; experiment: presets) list
their YAML files.
"""

import sys
import textwrap
from importlib import resources
from pathlib import Path

from runner import registry

ORDER = ("strategy", "cross_device_ops", "cluster", "model", "data", "executor", "experiment")
OPEN_GROUPS = {
    "model": "an uncompiled tf_keras model, built inside strategy.scope() (or your own _target_)",
    "experiment": "a preset applied last (experiment=guide_fit)",
}
START = "== Config groups: pick one option each (group=option) ==\n"
END = "\n== Plain config nodes"
WIDTH, INDENT = 114, "    "


def conf_dir() -> Path:
    return Path(str(resources.files("runner.conf")))


def _either(names, word: str) -> str:
    names = list(names)
    return ", ".join(names[:-1]) + f" {word} " + names[-1] if len(names) > 1 else "".join(names)


def _notes(group: str) -> list[str]:
    """What the options' capabilities say about how the groups combine."""
    strategies = registry.options("strategy").values()
    if group == "strategy":
        clusters = [c.name for c in registry.options("cluster").values() if c.caps.processes]
        return [
            f"{_either([s.name for s in strategies if s.caps.multi_process], 'and')} also run as the tasks of a "
            f"cluster: cluster={_either(clusters, 'or')}"
        ]
    if group == "cross_device_ops":
        takers = [
            f"{s.name} takes {', '.join(s.caps.cross_device_ops)}" for s in strategies if s.caps.cross_device_ops != ("auto",)
        ]
        return ["; ".join(takers) + "; the others only auto"]
    return []


def _wrap(text: str, indent: str, hang: str = "") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + hang, break_on_hyphens=False)


def _entry(group: str) -> list[str]:
    """`group: a, b, c`, then what the group builds, then one line per option, then how it combines with others."""
    if group in OPEN_GROUPS:
        names = sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))
        return [f"{group}: {', '.join(names)}", *_wrap(OPEN_GROUPS[group], INDENT)]
    options = registry.options(group).values()
    width = max(len(o.name) for o in options) + 2
    lines = [f"{group}: {', '.join(o.name for o in options)}", *_wrap(registry.intro(group) + ":", INDENT)]
    for o in options:
        lines += _wrap(f"{o.name.ljust(width)}{o.help}", INDENT + "  ", " " * width)
    for note in _notes(group):
        lines += _wrap(note, INDENT)
    return lines


def render() -> str:
    """The section's text (under the `START` heading, up to the next heading)."""
    return "\n".join(line for group in ORDER for line in _entry(group)) + "\n"


def _help_file() -> Path:
    return conf_dir() / "hydra" / "help" / "runner.yaml"


def _split(text: str):
    """(before the section, the section as the template has it, after it); the template is indented two spaces."""
    head, rest = text.split("  " + START, 1)
    section, tail = rest.split("\n  " + END[1:], 1)
    return head + "  " + START, textwrap.dedent(section), "\n  " + END[1:] + tail


def stale() -> bool:
    return _split(_help_file().read_text())[1] != render()


def write() -> None:
    head, _, tail = _split(_help_file().read_text())
    _help_file().write_text(head + textwrap.indent(render(), "  ") + tail)


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        sys.exit(1 if stale() else 0)
    write()
