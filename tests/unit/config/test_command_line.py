"""runner/config/command_line.py: the command line checked before Hydra reads it, against Hydra's own parser."""

import re
import shlex

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.config import command_line

PARSER = OverridesParser.create()


def _written(message: str) -> str:
    """The override a message tells the user to write (`write key='value' (in a shell: ...)`), checked to be what
    the shell form gives as one word."""
    found = re.search(r", write (.*?) \(in a shell: (.*?)\); nothing ran", message)
    assert found, message
    assert shlex.split(found.group(2)) == [found.group(1)], message
    return found.group(1)


def _reads(override: str):
    value = PARSER.parse_override(override).value()
    return [getattr(item, "text", item) for item in value.list] if hasattr(value, "list") else value


def test_an_override_hydra_cannot_read_is_named_with_the_quoted_form_hydra_reads_back():
    """Hydra's own error names neither the override nor the fix (`mismatched input '=' expecting <EOF>`)."""
    cases = {
        "mlflow.tracking_uri=sqlite:///runs.db?timeout=20": "sqlite:///runs.db?timeout=20",  # a query's `=`
        "data.path=/data/données.npz": "/data/données.npz",  # beyond ASCII
        "mlflow.run_name=it's=1": "it's=1",  # a quote in it: the other quotes
        "mlflow.run_name=a$b=c": "a$b=c",  # `$` would expand in a shell's double quotes
        """mlflow.run_name=both ' and " =""": """both ' and " =""",  # both quote kinds: Hydra's escape, \\'
        "mlflow.run_name=b=c\\": "b=c\\",  # a trailing backslash would escape the closing quote: doubled
    }
    for override, value in cases.items():
        message = command_line.unreadable_override_problem(["train.epochs=1", override, "strategy=mirrored,default"])
        assert message.startswith(f"{override}: ") and "\n" not in message, message
        assert _reads(_written(message)) == value
    sweep = command_line.unreadable_override_problem(["-m", "data.path=/d/données1.npz,/d/données2.npz"])
    assert _reads(_written(sweep)) == ["/d/données1.npz", "/d/données2.npz"], sweep  # still two jobs
    password = command_line.unreadable_override_problem(["mlflow.tracking_uri=postgresql://me:s3cret@db/runs?sslmode=require"])
    assert "s3cret" not in password and "postgresql://me:***@db/runs?sslmode=require" in password, password
    assert password.endswith("write yours in its place.")


def test_a_broken_list_or_function_is_not_turned_into_text():
    for override, hydra_says in (("model.hidden_units=[64,32", "no viable alternative"), ("lr=choise(0.1,0.01)", "choise")):
        message = command_line.unreadable_override_problem(["-m", override])
        assert message.startswith(f"{override} is not an override Hydra can read") and "write" not in message, message
        assert hydra_says in message, message  # Hydra's own reason, kept


def test_a_list_nested_past_what_composing_can_take_is_one_line():
    """150 levels: Hydra's parser reads it, and composing it ended in a RecursionError traceback of 4000 lines."""
    message = command_line.unreadable_override_problem(["model.hidden_units=" + "[" * 150 + "]" * 150])
    assert message.startswith("model.hidden_units= nests lists or dicts 150 levels deep"), message
    assert command_line.unreadable_override_problem(["a=" + "[" * 3 + "1" + "]" * 3, "b='[[[[[[[[[[[['"]) == ""


def test_what_hydra_reads_passes():
    for argv in (
        ["data.path='/data/données.npz'"], ["-cn", "a=b"], ["-cd", "x=y"], ["--experimental-rerun", "out/lr=0.1/c.pickle"],
        ["--cfg", "job", "strategy=mirrored,default"], [], ["+train.x=", "~train.y", "~mlflow.run_name=a", "train.epochs="],
        ["hydra/launcher=basic"], ["-m", "train.seed=range(1,3)", "strategy=glob(*)"], ["hydra.run.dir=out/${now:%H}"],
        ["--config-dir=/a=b"],
    ):  # fmt: skip
        assert command_line.unreadable_override_problem(argv) == "", argv


def test_overrides_and_a_sweep_are_read_as_hydras_own_parser_reads_them():
    """No hand copy of Hydra's flags: a flag's value is not an override, an abbreviated or attached -m is a sweep."""
    assert command_line.overrides_in(["-cd", "conf=x", "a=1", "b=2", "--cfg=job"]) == ["a=1", "b=2"]
    assert command_line.overrides_in(["a=1", "-m", "b=2"]) == []  # Hydra refuses it: command_problem says why
    assert command_line.overrides_in(["--experimental-rerun", "out/lr=0.1/c.pickle", "c=3"]) == ["c=3"]
    assert command_line.overrides_in(["--cfg", "bogus", "a=1"]) == []  # argparse refuses: Hydra says why itself
    for argv in (["-m"], ["--multi", "a=1"], ["--multirun"], ["a=1", "-m"], ["hydra.mode=MULTIRUN", "a=1,2"]):
        assert command_line.multirun(argv), argv
    for argv in ([], ["a=-m"], ["-cd", "-m"], ["--cfg", "job"], ["hydra.mode=RUN"], ["x.hydra.mode=MULTIRUN"]):
        assert not command_line.multirun(argv), argv
    sweep = command_line.unreadable_override_problem(["--multi", "data.path=/d/données1.npz,/d/données2.npz"])
    assert _reads(_written(sweep)) == ["/d/données1.npz", "/d/données2.npz"], sweep


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=12), st.booleans())
def test_a_value_is_refused_exactly_when_hydra_cannot_read_it_and_any_form_suggested_reads_back(value, sweep):
    override = f"mlflow.run_name={value}"
    try:
        PARSER.parse_overrides([override])
        readable = True
    except HydraException:
        readable = False
    message = command_line.unreadable_override_problem([*(["-m"] if sweep else []), override])
    assert bool(message) is not readable, message
    if message and ", write " in message:
        parts = value.split(",") if sweep and "," in value else [value]
        assert _reads(_written(message)) == (parts if len(parts) > 1 else value)


def test_a_directory_override_as_the_path_hydra_will_use():
    assert command_line.path_of("hydra.run.dir='/srv/a b'") == "/srv/a b"
    assert command_line.path_of('resume="out/lr=0.1"') == "out/lr=0.1"
    assert command_line.path_of("resume=outputs/x") == "outputs/x"
    assert command_line.path_of("hydra.run.dir=3") == "3"
    for none in ("resume=", "resume=null", "resume=''"):  # a new run
        assert command_line.path_of(none) == "", none
    for later in ("hydra.run.dir=runs/${now:%H-%M-%S}", "hydra.run.dir=x1,x2", "hydra.run.dir=[a,b]", "hydra.run.dir=a?b=c"):
        assert command_line.path_of(later) is None, later  # known once Hydra composes it, or no path at all


def test_two_hydra_commands_on_one_line_are_one_error_naming_both():
    """`-m --cfg job` is a ValueError in Hydra, printed as a traceback."""
    message = command_line.command_problem(["-m", "--cfg", "job", "strategy=mirrored,default"])
    assert message.startswith("--multirun and --cfg cannot be used together") and "without -m" in message
    assert command_line.command_problem(["--info=config", "--run"]).startswith("--run and --info cannot")
    assert command_line.command_problem(["--resolve"]).startswith("--resolve works with --cfg")
    assert command_line.command_problem(["--hydra-help", "--resolve"]).startswith("--resolve")  # Hydra checks it first
    for abbreviated in (["--multi", "--cfg", "job"], ["-mc", "job"], ["-cjob", "-m"]):  # argparse's forms, as Hydra reads
        assert command_line.command_problem(abbreviated).startswith("--multirun and --cfg cannot"), abbreviated
    assert command_line.command_problem(["--reso"]).startswith("--resolve works with --cfg")
    helped = (["--help", "-m", "--cfg", "job"], ["--hydra-help", "-m", "-c", "job"])  # Hydra prints help first
    for fine in (["-m", "a=1,2"], ["--cfg=job", "--resolve"], ["-cjob", "--resolve"], ["--help", "--resolve"], *helped):
        assert command_line.command_problem(fine) == "", fine


def test_overrides_on_both_sides_of_a_flag_are_one_line_with_the_command_hydra_takes():
    """Hydra's argparse takes one run of overrides: `strategy=mirrored -m executor=fit,custom_loop` ended in its usage
    text and `unrecognized arguments`. The command suggested is read by that parser with every override kept."""
    for argv in (
        ["strategy=mirrored", "-m", "executor=fit,custom_loop"], ["a=1", "--cfg", "job", "b=2", "c=3"],
        ["a=1", "-cd", "conf=x", "b=2"], ["mlflow.run_name='a b'", "--multi", "c=3"],
    ):  # fmt: skip
        message = command_line.command_problem(argv)
        assert "between overrides" in message and message.endswith(". Nothing ran.") and "\n" not in message, message
        suggested = shlex.split(message.partition("Write python -m runner ")[2].removesuffix(". Nothing ran."))
        assert sorted(suggested) == sorted(argv) and command_line.hydra_args(suggested), suggested
        assert command_line.hydra_args(argv) is None and command_line.overrides_in(argv) == []
    assert command_line.command_problem(["a=1", "--bogus"]) == ""  # an unknown flag: Hydra's parser names it
    secret = command_line.command_problem(["mlflow.tracking_uri=http://me:s3cret@h", "-m", "a=1,2"])
    assert "s3cret" not in secret and secret.endswith("write yours in its place."), secret


def test_config_only_commands_are_seen_in_every_form_hydra_takes():
    for argv in (["--cfg", "job"], ["--cfg=job"], ["-cjob"], ["--cf", "job"], ["--info=searchpath"], ["--hel"], ["-h"]):
        assert command_line.config_only([*argv, "hydra.run.dir=x"]), argv
    for argv in (["hydra.run.dir=x"], ["-m", "a=1,2"], ["resume=out/run"], []):
        assert not command_line.config_only(argv), argv


def test_a_character_that_does_not_show_is_marked_where_it_is():
    problem = command_line.unreadable_override_problem(["train.epochs\u200b=3"])
    assert problem.startswith("train.epochs<U+200B>=3 (<U+...> marks a character that does not show)"), problem


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40).filter(lambda t: "${" not in t))
def test_a_value_the_runner_passes_to_a_child_reads_back_as_itself(value):
    """hydra.run.dir, checkpoint.dir and resume= for a launcher's task or a sweep's job (command_line.override): a
    directory with a space, a comma, quotes or characters beyond ASCII was refused by the task's Hydra."""
    written = command_line.override("hydra.run.dir", value)
    assert _reads(written) == value, written
