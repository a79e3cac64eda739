"""The configuration reference, docs/reference/config.md, generated from the code so that it cannot drift.

Every key comes from the typed schemas (runner.config.schema's plain nodes, each group option's schema beside its
builder), with its type as annotated, its default, its valid range or choices (runner.config.fields) and what it
does: the comment written above or beside the field, which is where the schemas say it. The groups' options and
their one-line help are the registry's (the same that `--help` lists), the models' and presets' the first sentence
of their YAML file; the exit codes are runner.errors' classes.

    python -m runner.config.reference > docs/reference/config.md

tests/unit/config/test_reference.py fails when the page is stale.
"""

import ast
import dataclasses
import enum
import inspect
import io
import sys
import textwrap
import tokenize
from pathlib import Path

from omegaconf import MISSING

from runner import errors
from runner.config import fields, helptext, registry, schema

PAGE = Path("docs") / "reference" / "config.md"
SKIPPED = {"name"}  # an option schema's own name: the option chosen, not a key to set


def _field_nodes(cls) -> dict[str, tuple[ast.AnnAssign, str]]:
    """{field: (its annotated assignment, its comment)} from the class's source: the comment lines right above the
    field and the comment at the end of its lines."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    found = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, line = [], node.lineno - 1
        while line >= 1 and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        beside = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        text = " ".join(c for c in above + beside if not c.startswith("noqa"))
        found[node.target.id] = (node, text)
    return found


def _annotations(cls) -> dict[str, tuple[str, str]]:
    """{field: (type, what it does)} over the class and its bases (a base's fields first, as dataclasses order them)."""
    found = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base) and base is not object:
            for name, (node, text) in _field_nodes(base).items():
                found[name] = (ast.unparse(node.annotation), text)
    return found


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return MISSING


def _shown(value) -> str:
    if value == MISSING:
        return "required"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str) and value.startswith("${"):
        return "derived"
    return f"`{value}`"


def _allowed(f: dataclasses.Field) -> str:
    """The field's valid range or choices, as runner.config.validate checks them."""
    if "choices" in f.metadata:
        said = ", ".join(f"`{c}`" for c in fields.choices(f.metadata["choices"]))
        return said + (", or a `_target_` node" if f.metadata.get("or_target") else "")
    bound: fields.Range | None = f.metadata.get("range")
    if bound is None:
        return ""
    parts = [
        f"{sign} {limit:g}" if isinstance(limit, float) else f"{sign} {limit}"
        for sign, limit in (("≥", bound.ge), (">", bound.gt), ("≤", bound.le), ("<", bound.lt))
        if limit is not None
    ]
    if bound.null:
        parts.append(f"`null`: {bound.null}")
    if bound.why.startswith("or "):
        parts.append(bound.why)
    return "; ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(cls, prefix: str, option: bool = False) -> list[str]:
    """One table row per key of the dataclass, nested dataclasses flattened under their key."""
    described = _annotations(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if option and f.name in SKIPPED:
            continue
        value, key = _default(f), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            rows += _rows(type(value), key + ".")
            continue
        kind, text = described.get(f.name, ("", ""))
        rows.append(f"| `{key}` | `{_cell(kind)}` | {_cell(_shown(value))} | {_cell(_allowed(f))} | {_cell(text)} |")
    return rows


def _table(cls, prefix: str, option: bool = False) -> list[str]:
    rows = _rows(cls, prefix, option)
    if not rows:
        return []
    return ["| key | type | default | allowed | what it does |", "|---|---|---|---|---|", *rows, ""]


def _doc(cls) -> str:
    """The class's own docstring (not one it inherits or dataclass' generated signature)."""
    text = cls.__dict__.get("__doc__") or ""
    return "" if text.startswith(f"{cls.__name__}(") else " ".join(text.split())


def _groups() -> list[str]:
    out = ["## Config groups", ""]
    out += [
        "Choose one option per group (`group=option`); `*` marks the default. An option's keys are set under the "
        "group's name (`cluster.workers=2`).",
        "",
    ]
    for group in helptext.ORDER:
        default = helptext.defaults().get(group)
        intro = registry.intro(group) if group in registry.GROUPS else helptext.INTROS.get(group, "")
        out += [f"### {group}", ""]
        if intro:
            out += [intro[0].upper() + intro[1:] + ".", ""]
        out += ["| option | what it is |", "|---|---|"]
        for name, text in sorted(helptext._options(group), key=lambda o: o[0] != default):
            mark = f" {helptext.DEFAULT}" if name == default else ""
            out.append(f"| `{group}={name}`{mark} | {_cell(text)} |")
        out.append("")
        if group not in registry.GROUPS:
            continue
        for option in registry.options(group).values():
            table = _table(option.schema, f"{group}.", option=True)
            if table:
                doc = _doc(option.schema)
                out += [f"#### `{group}={option.name}`", "", *([doc, ""] if doc else []), *table]
    return out


def _plain() -> list[str]:
    out = ["## Keys outside the groups", ""]
    top = []
    for f in dataclasses.fields(schema.RunnerConfig):
        value = _default(f)
        if f.name in helptext.ORDER:
            continue
        if dataclasses.is_dataclass(value):
            out += [f"### {f.name}", ""]
            doc = _doc(type(value))
            out += [doc, ""] if doc else []
            out += _table(type(value), f"{f.name}.")
        else:
            top.append(f)
    if top:
        out += ["### Top-level keys", ""]
        described = _annotations(schema.RunnerConfig)
        out += ["| key | type | default | allowed | what it does |", "|---|---|---|---|---|"]
        for f in top:
            kind, text = described[f.name]
            out.append(f"| `{f.name}` | `{_cell(kind)}` | {_cell(_shown(_default(f)))} | {_cell(_allowed(f))} | {_cell(text)} |")
        out.append("")
    return out


def _exit_codes() -> list[str]:
    out = ["## Exit codes", "", "| exit code | error | when |", "|---|---|---|", "| 0 | | the run finished |"]
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.RunnerError)]
    for cls in sorted(classes, key=lambda c: (c.exit_code, c.__name__)):
        out.append(f"| {cls.exit_code} | `{cls.__name__}` | {_cell(_doc(cls) or 'any other failure; the message says what')} |")
    out += [
        "| 130 | | stopped by Ctrl-C (SIGINT) after a checkpoint; the MLflow run is KILLED |",
        "| 143 | | stopped by SIGTERM (a scheduler's preemption) after a checkpoint; the MLflow run is KILLED |",
        "",
    ]
    return out


def render() -> str:
    head = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m runner.config.reference > docs/reference/config.md`: edit the schemas, not this "
        "page (tests/unit/config/test_reference.py fails when it is stale). -->",
        "",
        "Every key the runner takes, from its typed schemas: set any of them on the command line (`train.epochs=3`), in "
        "a preset (`conf/experiment/`) or in your own config. `python -m runner --cfg job` prints a run's whole config; "
        "`python -m runner --help` lists the groups. A value outside its range or choices is refused before TensorFlow "
        "starts, with exit code 2.",
        "",
    ]
    return "\n".join(head + _groups() + _plain() + _exit_codes()).rstrip() + "\n"


def main() -> None:
    schema.register()
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
