"""Names a user mistyped, said as one paragraph with the closest real ones: an unknown key (`train.epoch` -> did you
mean train.epochs?), a key of another option than the one selected, a group option with no config file, an override
Hydra refused, and an override Hydra's grammar cannot read (a value it takes only quoted). Pure: the composed config and the
registry in, text out. The check that refuses an unknown key is `validate.no_unknown_keys`; `hydra_private` asks here
for what Hydra refused while composing.
"""

import dataclasses
import difflib
import shlex

from omegaconf import DictConfig, OmegaConf

from runner.config import registry
from runner.config.redact import redact


def unknown_keys(node, prefix: str = "") -> list[tuple[str, list[str]]]:
    """(full key, the keys its node has) for every key a schema does not declare. Hydra refuses such keys while it
    composes, except when they are added with `+key=value`, which bypasses the schema."""
    kind = OmegaConf.get_type(node)
    known = [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else None
    found = []
    for key in node.keys():
        full = f"{prefix}{key}"
        if known is not None and key not in known:
            found.append((full, known))
        elif isinstance(node._get_node(key), DictConfig):
            found += unknown_keys(node[key], full + ".")
    return found


def close_names(word: str, known) -> list[str]:
    """The names in `known` closest to a mistyped `word` (difflib), best first: at most 3, none when nothing is close."""
    return difflib.get_close_matches(str(word), [str(k) for k in known], n=3, cutoff=0.6)


def _as_override(key: str, value) -> str:
    """`key=value` for a value given as text or a scalar, else the key alone."""
    if isinstance(value, bool):
        value = str(value).lower()
    return f"{key}={value}" if isinstance(value, (str, int, float)) else key


def key_owners(parent: str, key: str) -> list[str]:
    """The options of group `parent` whose schema has `key` (strategy.devices: mirrored and central_storage): a key of
    another option than the one selected."""
    if parent not in registry.GROUPS:
        return []
    return [
        o.name
        for o in registry.options(parent).values()
        if dataclasses.is_dataclass(o.schema) and key in {f.name for f in dataclasses.fields(o.schema)}
    ]


def unknown_key_problem(key: str, known, *, value=None, rest: str = "", selected=None, how: str = "") -> str:
    """A key its node does not have, with the closest real keys: `train.epoch is not a key of train: did you mean
    train.epochs=3? The keys of train are: ...`. `value` makes the suggestion a whole override; `rest` is what came
    after the unknown part (trian.epochs: `epochs`), kept in the suggestion; `selected` is the group's selected option
    (strategy=auto), for a key that another option has; `how` follows the key (how it was given)."""
    parent, _, name = key.rpartition(".")
    where = f"{parent}={selected}" if selected else parent or "the config"
    close = [f"{parent}.{c}" if parent else c for c in close_names(name, known)]
    text = f"{key} is not a key of {where}{how}"
    if close:
        text += f": did you mean {' or '.join(_as_override(f'{c}.{rest}' if rest else c, value) for c in close)}?"
    else:
        text += ", and none of its keys has a similar name."
    text += f" The keys of {where} are: {', '.join(str(k) for k in known)}."
    owners = [o for o in key_owners(parent, name) if o != selected]
    if owners:
        first = f"{parent}={owners[0]} {_as_override(f'{key}.{rest}' if rest else key, value)}"
        text += f" {name} is a key of {parent}={' or '.join(owners)}: select it first ({first})."
    return text


COMPOSED = "every key and its value: python -m runner --cfg job"


def override_problem(key: str, value: str, cfg: DictConfig, hydra_says: str) -> str | None:
    """Hydra refused `key=value` from the command line: the key is not in the composed config `cfg` (a typed node:
    not in its schema; an open one, as model: not in its YAML). The message names the unknown part of the key and
    the closest real keys there; a mistyped group name (stratgy=mirrored) is a key of the root config, so it is
    found the same way. None when the key's path is not a mistyped name (Hydra's own message stays)."""
    parts, node = key.split("."), cfg
    for i, part in enumerate(parts):
        keys = [str(k) for k in node.keys()]
        if part not in keys:
            parent = ".".join(parts[:i])
            selected = node.get("name") if parent in registry.GROUPS and "name" in keys else None
            problem = unknown_key_problem(
                ".".join(parts[: i + 1]), keys, value=value, rest=".".join(parts[i + 1 :]), selected=selected
            )
            if not dataclasses.is_dataclass(OmegaConf.get_type(node)):  # open (model): a new argument is added with +
                problem += f" A new key is added with +{key}={value}."
            return f"{problem} Nothing ran (Hydra: {hydra_says}); {COMPOSED}."
        child = node._get_node(part)
        if not isinstance(child, DictConfig) or child._is_none() or child._is_missing():
            return None  # a path through a value: not a name problem
        node = child
    return None


def option_problem(group: str, name: str, options, hydra_says: str, searched=()) -> str:
    """`group=name` names no config file of the group: the closest options, and every option."""
    close = close_names(name, options)
    text = f"{group}={name} is not an option of {group}"
    text += f": did you mean {' or '.join(f'{group}={c}' for c in close)}?" if close else ", and no option has a similar name."
    where = f"; searched {', '.join(searched)}" if searched else ""
    return f"{text} The options of {group} are: {', '.join(options)}. Nothing ran (Hydra: {hydra_says}{where})."


VALUE_FLAGS = ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-c", "--cfg", "-p", "--package")


def unreadable_override_problem(argv) -> str:
    """An override Hydra's grammar cannot read, named, with what Hydra says and the form that works; '' when every
    override parses. Hydra's own error names neither the override nor the fix (`mismatched input '=' expecting
    <EOF>` for `mlflow.tracking_uri=postgresql://h/db?sslmode=require`). A text value with characters the grammar
    keeps for itself (`=`, `?`'s query, spaces, quotes, characters beyond ASCII) reads inside quotes; a list or dict
    is shown its syntax instead, since quoting it would make it a string."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    after_flag = {i + 1 for i, a in enumerate(argv) if a in VALUE_FLAGS}  # `-cn name`: a flag's value, no override
    overrides = [a for i, a in enumerate(argv) if "=" in a and not a.startswith("-") and i not in after_flag]
    parser = OverridesParser.create()
    try:
        parser.parse_overrides(overrides)
        return ""
    except HydraException:
        pass
    for arg in overrides:
        try:
            parser.parse_overrides([arg])
            continue
        except HydraException as err:
            hydra_says = str(err).split("\n")[0].strip()
        key, _, value = arg.partition("=")
        quote = "'" if "'" not in value else '"'
        quoted = f"{key}={quote}{value}{quote}"
        if value.lstrip()[:1] in ("[", "{") or not _reads_as(parser, quoted, value):
            return redact(
                f"{arg} is not an override Hydra can read ({hydra_says}): a list is key=[a,b], a dict key={{k: v}}, "
                "and text with characters such as = , [ ] { } ( ) or spaces goes inside quotes; see "
                "https://hydra.cc/docs/advanced/override_grammar/basic/. Nothing ran."
            )
        shell = f'"{quoted}"' if quote == "'" and not set(value) & set('$`"\\!') else shlex.quote(quoted)
        why = "characters beyond ASCII" if not value.isascii() else "characters its grammar keeps for itself"
        return redact(
            f"{arg}: Hydra's override grammar takes a value with {why} only inside quotes ({hydra_says}). Write "
            f"{quoted} (in a shell: {shell}); nothing ran."
        )
    return ""


HYDRA_COMMANDS = {"-r": "--run", "--run": "--run", "-m": "--multirun", "--multirun": "--multirun", "-c": "--cfg",
                  "--cfg": "--cfg", "-i": "--info", "--info": "--info", "-sc": "--shell-completion",
                  "--shell-completion": "--shell-completion"}  # fmt: skip


def command_problem(argv) -> str:
    """Two of Hydra's commands on one line (`-m --cfg job`): Hydra raises a ValueError there, a traceback."""
    given = list(dict.fromkeys(HYDRA_COMMANDS[a.split("=")[0]] for a in argv if a.split("=")[0] in HYDRA_COMMANDS))
    if len(given) < 2:
        return ""
    hint = (
        " To see one job of a sweep, pass that job's overrides with --cfg job and no -m."
        if "--multirun" in given and "--cfg" in given
        else ""
    )
    return (
        f"{' and '.join(given)} cannot be used together: Hydra does one of --run, --multirun, --cfg, --info and "
        f"--shell-completion per command.{hint} Nothing ran."
    )


def _reads_as(parser, override: str, value: str) -> bool:
    """Whether Hydra reads `override` as the text `value` (not only: parses it)."""
    from hydra.errors import HydraException

    try:
        return parser.parse_override(override).value() == value
    except HydraException:
        return False
