"""The command line as Hydra will read it, checked before Hydra runs: two of Hydra's commands at once, an override
its grammar cannot read (each one paragraph instead of Hydra's traceback or its message without the override), and
a directory override's value as the path Hydra will use, for the runner's own checks before Hydra (quotes taken
off)."""

import functools
import re
import shlex

from runner.config.redact import redact, visible

GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"
MAX_DEPTH = 32  # lists and dicts in one override: no config of the runner's goes past a few levels
CONFIG_ONLY = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "--shell-completion", "-sc")


def config_only(argv) -> bool:
    """Whether Hydra only prints (help, config, info) for `argv`: nothing runs, nothing is to be created. Hydra's
    flags as its own parser reads them, so `--cfg=job`, `-cjob` and `--info=searchpath` count too."""
    if any(a in CONFIG_ONLY for a in argv):
        return True
    if not any(a.startswith("-") for a in argv):
        return False
    args = hydra_args(argv)
    return bool(args) and bool(args.help or args.hydra_help or args.cfg or args.info is not None or args.shell_completion)


@functools.cache
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def hydra_args(argv):
    """`argv` as Hydra's own argparse parser reads it, or None where Hydra refuses it before anything runs (it then
    says why). Read once per command line: the checks before Hydra all ask."""
    parsed = _parsed(tuple(argv))
    return parsed[0] if parsed and not parsed[1] else None


@functools.lru_cache(maxsize=8)
def _parsed(argv: tuple):
    from runner.config.hydra_private import hydra_args as parsed

    return parsed(argv)


def overrides_in(argv) -> list[str]:
    """The key=value overrides Hydra will read in `argv`, as its own parser finds them (a flag's value such as
    `-cd dir=x` is not one). [] when that parser refuses the command line: Hydra then says why itself."""
    args = hydra_args(argv)
    return list(args.overrides) if args else []


def multirun(argv) -> bool:
    """Whether `argv` asks Hydra for a sweep: -m in any form Hydra's parser takes (--multirun, --multi), or the
    override hydra.mode=MULTIRUN (an experiment config that sets it is known only once Hydra composes it)."""
    args = hydra_args(argv)
    if not args:
        return False
    return args.multirun or any(re.fullmatch(r"\s*hydra\.mode\s*=\s*(RunMode\.)?MULTIRUN\s*", o) for o in args.overrides)


def path_of(arg: str) -> str | None:
    """A directory override's value (resume=, hydra.run.dir=) as the path Hydra will use, for the checks that run
    before it: "" for none (resume=, resume=null); None when it is known only once Hydra has composed it (an
    interpolation such as ${now:%H-%M-%S}) or is no path at all (a sweep, a list, an override Hydra cannot read)."""
    from hydra.errors import HydraException

    try:
        value = _parser().parse_override(arg).value()
    except (HydraException, ValueError, RecursionError):
        return None
    if value is None:
        return ""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or "${" in str(value):
        return None
    return value if isinstance(value, str) else arg.partition("=")[2]


def command_problem(argv) -> str:
    """Two of Hydra's commands on one line (`-m --cfg job`, `--multi -cjob`), or --resolve without --cfg: Hydra raises
    a ValueError there, a traceback. '' otherwise, and with --help (Hydra prints help first). The flags as Hydra's own
    parser reads them: abbreviated and attached forms included."""
    parsed = _parsed(tuple(argv))
    if parsed is None:
        return ""
    args, left = parsed
    late = [a for a in left if "=" in a and not a.startswith("-")]
    if late:  # `strategy=mirrored -m executor=fit,custom_loop`: argparse takes one run of overrides
        words = [*args.overrides, *late]
        flags = [a for a in argv if a not in words]  # a flag's value stays beside its flag
        return _masked(
            f"{' '.join(late)} come{'s' if len(late) == 1 else ''} after {' '.join(flags)}, between overrides: Hydra "
            "reads its flags before or after the overrides, not among them. Write python -m runner "
            f"{' '.join(shlex.quote(a) for a in (*flags, *words))}. Nothing ran."
        )
    if left:
        return ""  # an unknown flag: Hydra's parser names it
    if args.resolve and not args.cfg and not args.help:  # Hydra checks this before --hydra-help
        return (
            "--resolve works with --cfg (job, hydra or all) or --help: it resolves interpolations in what they print. "
            "Nothing ran."
        )
    if args.help or args.hydra_help:
        return ""
    given = [name for name, on in (("--run", args.run), ("--multirun", args.multirun), ("--cfg", args.cfg),
             ("--info", args.info is not None), ("--shell-completion", args.shell_completion)) if on]  # fmt: skip
    if len(given) < 2:
        return ""
    both = {"--multirun", "--cfg"} <= set(given)
    hint = " To see one job of a sweep, give --cfg job that job's overrides, without -m." if both else ""
    return (
        f"{' and '.join(given)} cannot be used together: Hydra does one of --run, --multirun, --cfg, --info and "
        f"--shell-completion per command.{hint} Nothing ran."
    )


def unreadable_override_problem(argv) -> str:
    """The first override Hydra's grammar cannot read, named with what Hydra says and, where quoting gives Hydra
    exactly the text typed, the quoted form; '' when every override reads. Hydra's own message names neither
    (`mismatched input '=' expecting <EOF>` for `mlflow.tracking_uri=postgresql://h/db?sslmode=require`). A
    function (`choice(...)`), list or dict is not quoted: quotes would make it a string."""
    from hydra.errors import HydraException

    overrides = overrides_in(argv)
    for arg in overrides:
        if _depth(arg) > MAX_DEPTH:  # Hydra's parser reads it; composing it ends in a RecursionError traceback
            return (
                f"{redact(arg.partition('=')[0])}= nests lists or dicts {_depth(arg)} levels deep; the runner's config "
                f"takes at most {MAX_DEPTH}. Nothing ran."
            )
    try:
        _parser().parse_overrides(overrides)
        return ""
    except (HydraException, ValueError, RecursionError):
        pass
    sweep = multirun(argv)
    for arg in overrides:
        try:
            _parser().parse_overrides([arg])
            continue
        except (HydraException, ValueError, RecursionError) as err:
            said = [line.strip() for line in str(err).splitlines() if line.strip(" ^") and "hydra.cc" not in line]
        key, _, value = arg.partition("=")
        hydra_says = "; ".join(line for line in said if arg not in line)[:400]  # the lexer's lines repeat the override
        written = None if said and said[0].startswith("Error parsing override") else _quoted(key, value, sweep)
        if written is None:
            seen = visible(arg)
            shown = f"{seen} (<U+...> marks a character that does not show)" if seen != arg else arg
            text = (
                f"{shown} is not an override Hydra can read{f' ({hydra_says})' if hydra_says else ''}. A list is "
                "key=[a,b], a dict key={k: v}, a sweep key=a,b (with -m), and text with characters the grammar keeps "
                f"for itself (= ? , [ ] {{ }} ( ) quotes, characters beyond ASCII) goes inside quotes: key='text'. See "
                f"{GRAMMAR}. Nothing ran."
            )
        else:
            parts = _parts(value, sweep)
            what = f"the sweep over {', '.join(parts)}" if len(parts) > 1 else f"the text {value}"
            why = "characters beyond ASCII" if not value.isascii() else "characters its grammar keeps for itself"
            text = (
                f"{arg}: Hydra's override grammar reads a value with {why} only inside quotes"
                f"{f' ({hydra_says})' if hydra_says else ''}. For {what}, write {written} (in a shell: {_shell(written)}); "
                "nothing ran."
            )
        return _masked(text)
    return ""


def _masked(text: str) -> str:
    """`text` redacted; where a password was masked in a command to copy, it says so."""
    masked = redact(text)
    return masked if masked == text else masked + " A password is shown as ***: write yours in its place."


def _depth(arg: str) -> int:
    """How deep the brackets of an override nest, outside quotes."""
    depth = deepest = 0
    quote = None
    for char in arg:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]})":
            depth -= 1
    return deepest


def _parts(value: str, sweep: bool) -> list[str]:
    return value.split(",") if sweep and "," in value else [value]


def _quoted(key: str, value: str, sweep: bool) -> str | None:
    """`key=` and `value` quoted (each value of a -m sweep on its own) when Hydra reads that back as exactly the text
    typed; None when it would not, or when the value is a function, list or dict."""
    from hydra.errors import HydraException

    if value.lstrip()[:1] in ("[", "{") or re.match(r"\s*[A-Za-z_]\w*\s*\(", value):
        return None
    parts = _parts(value, sweep)
    quoted = []
    for part in parts:
        quote = next((q for q in ("'", '"') if q not in part), None)
        plain = quote is not None and not part.endswith("\\")
        quoted.append(f"{quote}{part}{quote}" if plain else _escaped(part))
    written = f"{key}={','.join(quoted)}"
    try:
        read = _parser().parse_override(written).value()
    except (HydraException, ValueError, RecursionError):
        return None
    read = [getattr(item, "text", item) for item in read.list] if hasattr(read, "list") else [read]  # a sweep's QuotedStrings
    return written if read == parts else None


def override(key: str, value: str) -> str:
    """`key=value` for a child process's command line, read back by Hydra as exactly `value`: plain where the
    grammar takes it as text as it is (a path: `/` keeps Hydra from reading a number, a boolean or null), else in
    quotes (a space, a comma or characters beyond ASCII)."""
    plain = "/" in value and re.fullmatch(r"[A-Za-z0-9_./:+-]+", value)
    return f"{key}={value}" if plain else f"{key}={_escaped(value)}"


def _escaped(part: str) -> str:
    """`part` in single quotes with Hydra's escapes: a quote inside as \\', the backslashes before a quote or at the
    end doubled (https://hydra.cc/docs/advanced/override_grammar/basic/#escaped-characters-in-quoted-values)."""
    inner = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", part)
    return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, inner) + "'"


def _shell(written: str) -> str:
    """`written` as one shell word: in double quotes where nothing in it expands there, else as shlex quotes it."""
    return f'"{written}"' if not set(written) & set('$`"\\!') else shlex.quote(written)
