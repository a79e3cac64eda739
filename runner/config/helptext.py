"""The config-group section of `python -m runner --help`, generated from the registry and conf/.

Hydra's help template (conf/hydra/help/runner.yaml) takes it through the `${runner.config_groups:}` resolver that
runner.app registers, so a new option is listed with nothing to regenerate. Each group is one line of its options
(the default first: the defaults list of conf/config.yaml) and what the group is where that fits, then one line per
option, the default marked `*`. A registered option's line is its `help`; the groups without a registry (model: any
`_target_`; experiment: presets) have a line per YAML file, the first sentence of the file's leading comment: a new
model or preset is described by the comment it starts with. A description longer than its line is cut at a clause
boundary (`one_line`); README has the whole story.
"""

import functools
import re
import textwrap
from importlib import resources
from pathlib import Path

import yaml

from runner.config import registry

ORDER = ("strategy", "cross_device_ops", "cluster", "model", "data", "executor", "experiment")
INTROS = {  # what a group is, beside its options: the groups without a registry, and data's key that fits there
    "model": "an uncompiled tf_keras model built in strategy.scope(), or your own _target_ (Keras 3 too)",
    "experiment": "a preset applied last",
    "data": "the input path: data.input",
}
DEFAULT = "*"
START = f"== Config groups: pick one option each (group=option; {DEFAULT} the default) ==\n"
END = "\n== Plain config nodes"
WIDTH, INDENT = 114, "    "


def conf_dir() -> Path:
    return Path(str(resources.files("runner.conf")))


@functools.cache
def defaults() -> dict[str, str]:
    """{group: its default option} from the defaults list of conf/config.yaml (`- strategy: auto`). Read once per
    process: every composition renders the help template (OmegaConf dereferences it while merging Hydra's config)."""
    found = {}
    for entry in yaml.safe_load((conf_dir() / "config.yaml").read_text())["defaults"]:
        if isinstance(entry, dict):
            ((group, option),) = entry.items()
            if option is not None and not str(group).startswith("override "):
                found[str(group)] = str(option)
    return found


def _combines(group: str, name: str) -> str:
    """What an option's capabilities say about another group, appended to its line."""
    if group == "strategy" and registry.options(group)[name].caps.multi_process:
        return f"; also on cluster={', '.join(c.name for c in registry.options('cluster').values() if c.caps.processes)}"
    return ""


def _notes(group: str) -> list[str]:
    """What the options' capabilities say about how the groups combine, under the group."""
    if group == "cross_device_ops":  # every strategy takes auto, the default: which take more
        takers = [s for s in registry.options("strategy").values() if s.caps.cross_device_ops != ("auto",)]
        more = [f"{s.name} also {', '.join(o for o in s.caps.cross_device_ops if o != 'auto')}" for s in takers]
        return ["; ".join(more).replace(" also ", " also takes ", 1)]
    return []


def _wrap(text: str, indent: str, hang: str = "") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + hang, break_on_hyphens=False)


def _boundaries(text: str):
    """(position, depth, closing brackets) of each clause boundary in `text`: before ', ', '; ', ': ' or ' (' outside
    any brackets, before '; ' inside them."""
    stack = []
    for i, c in enumerate(text):
        if text.startswith((", ", "; ", ": ", " (") if not stack else "; ", i):
            yield i, len(stack), "".join({"(": ")", "[": "]"}[b] for b in reversed(stack))
        if c in "([":
            stack.append(c)
        elif c in ")]" and stack:
            stack.pop()


def one_line(text: str, room: int) -> str:
    """`text` if it fits in `room` characters, else its longest head that ends at a clause boundary and fits: one
    outside any brackets, or, when that keeps less than half the room, one just inside a pair of them (closed)."""
    if len(text) <= room:
        return text
    heads = {0: "", 1: ""}
    for i, depth, closing in _boundaries(text):
        if depth in heads and i + len(closing) <= room:
            heads[depth] = text[:i] + closing
    if len(heads[0]) * 2 >= room or len(heads[1]) <= len(heads[0]):
        return heads[0] or text[: room - 3] + "..."
    return heads[1]


def described(path: Path) -> str:
    """The first sentence of the YAML file's leading comment (its `# @package` line aside)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if not text.startswith("@"):
            lines.append(text)
    if "" in lines:
        lines = lines[: lines.index("")]  # the first paragraph
    return re.split(r"(?<=[^.])\.(?:\s|$)", " ".join(lines), maxsplit=1)[0].strip()


def _options(group: str) -> list[tuple[str, str]]:
    """(name, one-line description) of each option, the default first (model: by name, the default marked only)."""
    default = defaults().get(group)
    if group not in registry.GROUPS:
        return [(p.stem, described(p)) for p in sorted((conf_dir() / group).glob("*.yaml"))]
    found = registry.options(group).values()
    if group == "data":  # in memory, then streamed from files (a package: registered in its modules' name order)
        found = sorted(found, key=lambda o: o.caps.pipeline is not None)
    options = [(o.name, o.help + _combines(group, o.name)) for o in found]
    first = [(name, text.replace("one of the above", "one of the others")) for name, text in options if name == default]
    return first + [o for o in options if o[0] != default]  # strategy=auto, registered last, said "the above"


def _entry(group: str) -> list[str]:
    """`group: a, b, c  (what the group is)`, then one line per option, then how it combines with other groups."""
    options, default = _options(group), defaults().get(group)
    heading = f"{group}: {', '.join(name for name, _ in options)}"
    intro = INTROS.get(group) or registry.intro(group)
    room = WIDTH - len(heading) - 4
    lines = [heading + (f"  ({one_line(intro, room)})" if room > 16 else "")]  # strategy's: no room, its lines say
    width = max(len(name) for name, _ in options) + 2
    for name, text in options:
        label = (name + DEFAULT if name == default else name).ljust(width)
        lines.append(f"{INDENT}{label}{one_line(text, WIDTH - len(INDENT) - width)}")
    for note in _notes(group):
        lines += _wrap(note, INDENT)
    return lines


def render() -> str:
    """The section's text (under the `START` heading, up to the next heading)."""
    return "\n".join(line for group in ORDER for line in _entry(group)) + "\n"


@functools.cache
def for_template() -> str:
    """`render()` as Hydra's help template takes it: no final newline (the template has it), `$` doubled (the
    template goes through string.Template). Once per process, although every composition asks for it."""
    return render().rstrip("\n").replace("$", "$$")
