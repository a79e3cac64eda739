"""Names a user mistyped, said as one paragraph with the closest real ones: an unknown key (`train.epoch` -> did you
mean train.epochs?), a key of another option than the one selected, a group option with no config file, and an override
Hydra refused. Pure: the composed config and the
registry in, text out. The check that refuses an unknown key is `validate.no_unknown_keys`; `hydra_private` asks here
for what Hydra refused while composing.
"""

import dataclasses
import difflib

from omegaconf import DictConfig, OmegaConf

from runner.config import registry


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


def prefix_problem(override, cfg: DictConfig, hydra_says: str) -> str:
    """Hydra refused an override for its prefix or its shape, not its key's name: `+key=v` of a key already there,
    `~key` of a key the runner needs or one that is not there, anything else it could not apply."""
    key, line = override.key_or_group, override.input_line or override.key_or_group
    value = line.partition("=")[2]
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None, throw_on_resolution_failure=False) if parent else cfg
    known = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []  # keys(): nothing is resolved
    there = name in known
    if override.is_add() and there:
        text = (
            f"{line}: {key} is already in the config. Set it with {key}={value}: + adds a key that is not there "
            f"(++{key}={value} adds or sets)."
        )
    elif override.is_delete() and there and not value:
        text = f"{line} removes {key}, which a run needs. Give it another value instead ({key}=...)."
    elif override.is_delete() and not there:
        close = close_names(name, known)
        hint = f": did you mean {' or '.join('~' + (f'{parent}.{c}' if parent else c) for c in close)}?" if close else "."
        text = f"{line} removes nothing: {key} is not in the config{hint}"
    else:
        text = f"{line} cannot be applied to the config."
    return f"{text} Nothing ran (Hydra: {hydra_says}); {COMPOSED}."


def option_problem(group: str, name: str, options, hydra_says: str, searched=()) -> str:
    """`group=name` names no config file of the group: the closest options, and every option."""
    close = close_names(name, options)
    text = f"{group}={name} is not an option of {group}"
    text += f": did you mean {' or '.join(f'{group}={c}' for c in close)}?" if close else ", and no option has a similar name."
    where = f"; searched {', '.join(searched)}" if searched else ""
    return f"{text} The options of {group} are: {', '.join(options)}. Nothing ran (Hydra: {hydra_says}{where})."


def value_problem(key: str, value: str, omegaconf_says: str) -> str:
    """Hydra refused `key=value` from the command line: the value is not of the key's type."""
    return (
        f"{key}={value} has the wrong type for {key.lstrip('+~')} ({omegaconf_says.rstrip('.')}). Give it a value of "
        f"its type: every key's type and range is in docs/reference/config.md; {COMPOSED}. Nothing ran."
    )
