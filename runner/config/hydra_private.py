"""Every private Hydra name the runner touches, in one place.

Hydra has no public hook for the message it prints about a config it cannot compose. Two of its messages are
rewritten here, and nothing else changes: the exception class stays Hydra's, the exit code stays 1, and
HYDRA_FULL_ERROR=1 still shows the trace.
- A config file that is not valid YAML. Hydra prints the parser's traceback: the error is not one of its own, and
  it comes before the job runs, where Hydra strips nothing. It is raised as Hydra's composition error instead.
- A mistyped key (train.epoch=3, stratgy=mirrored) or option (strategy=mirored). Hydra's message runs over several
  lines and suggests nothing. It becomes one paragraph naming the closest real names (runner.config.validate builds it).
- An override Hydra refuses quotes its value: a password in it (a URL given to the wrong key) is masked.
- Hydra ends each of those paragraphs (its "compact" errors, which carry no trace to show) with "Set the environment
  variable HYDRA_FULL_ERROR=1 for a complete stack trace.": dropped for them; other errors keep it.
tests/unit/config/test_hydra_private.py fails loudly when a Hydra release moves any of these names. Until that test is fixed,
install() leaves Hydra's own messages as they are.
"""

import os
import re

CONFIG_REPOSITORY = "hydra._internal.config_repository.ConfigRepository"  # .load_config(self, config_path)
CONFIG_LOADER = "hydra._internal.config_loader_impl.ConfigLoaderImpl"  # .load_configuration, ._apply_overrides_to_config
ARGS_PARSER = "hydra._internal.utils.get_args_parser"  # Hydra's argparse parser of its own flags
RUN_AND_REPORT = "hydra._internal.utils.run_and_report"  # (func): prints an error escaping func, exits 1
_MARK = "_runner_hook"


def install() -> None:
    """Both rewrites, once per process (idempotent)."""
    _yaml_errors_in_one_paragraph()
    _suggest_close_names()
    _compact_errors_without_trailer()


def redact_text(text: str) -> str:
    from runner.config.redact import redact

    return redact(text)


def _cause(err):
    return err if os.environ.get("HYDRA_FULL_ERROR") == "1" else None


def yaml_problem(err) -> str:
    """A YAML parser error as one paragraph: the file, line and column, and the parser's reason."""
    mark = getattr(err, "problem_mark", None)
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a config file"
    reason = ": ".join(str(p) for p in (getattr(err, "context", None), getattr(err, "problem", None)) if p) or str(err)
    context = getattr(err, "context_mark", None)
    if context and mark and (context.line, context.column) != (mark.line, mark.column):
        reason += f" (that began at line {context.line + 1}, column {context.column + 1})"
    return (
        f"Error: {where}: this config file is not valid YAML: {reason}. Fix the file (indentation, a missing ':', "
        "an unclosed bracket or quote); Hydra could not compose the config, so nothing ran."
    )


def _yaml_errors_in_one_paragraph() -> None:
    import yaml
    from hydra.errors import ConfigCompositionException

    try:
        from hydra._internal.config_repository import ConfigRepository
    except ImportError:
        return
    load = ConfigRepository.load_config
    if getattr(load, _MARK, False):
        return

    def load_config(self, config_path):
        try:
            return load(self, config_path)
        except yaml.YAMLError as err:
            raise ConfigCompositionException(yaml_problem(err)) from err

    setattr(load_config, _MARK, True)
    ConfigRepository.load_config = load_config


def _suggest_close_names() -> None:
    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.errors import ConfigCompositionException, MissingConfigException
        from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError
    except ImportError:
        return
    if getattr(ConfigLoaderImpl.load_configuration, _MARK, False):
        return
    apply, load = ConfigLoaderImpl._apply_overrides_to_config, ConfigLoaderImpl.load_configuration

    def apply_overrides(overrides, cfg):
        for override in overrides:  # one at a time, as Hydra applies them: the refused one is known
            try:
                apply([override], cfg)
            except ConfigCompositionException as err:
                problem = None
                if isinstance(err.__cause__, (ConfigKeyError, ConfigAttributeError)) and override.input_line:
                    from runner.config.suggest import override_problem

                    said = str(err.__cause__).splitlines()[0]
                    full_key = getattr(err.__cause__, "full_key", None)
                    try:
                        problem = override_problem(
                            override.key_or_group,
                            override.input_line.partition("=")[2],
                            cfg,
                            f"{said}, full_key: {full_key}" if full_key else said,
                        )
                    except Exception:  # the message is a courtesy: never hide Hydra's error behind another one
                        problem = None
                elif isinstance(err.__cause__, ValidationError) and override.input_line:
                    from runner.config.suggest import value_problem

                    key, _, value = override.input_line.partition("=")
                    problem = value_problem(key, value, str(err.__cause__).splitlines()[0])
                if problem is None:
                    from runner.config.suggest import prefix_problem

                    said = f"{err}\n{err.__cause__}" if err.__cause__ is not None else str(err)  # as Hydra prints it
                    said = "; ".join(line.strip() for line in said.splitlines() if line.strip())
                    try:
                        problem = prefix_problem(override, cfg, said)
                    except Exception:  # the message is a courtesy: never hide Hydra's error behind another one
                        from runner.config.redact import redact

                        if redact(said) == said:
                            raise err from None
                        # a password given in the wrong key (train.epochs=https://user:secret@host): Hydra quotes it
                        raise ConfigCompositionException(redact(said)) from _cause(err)
                raise ConfigCompositionException(f"Error: {redact_text(problem)}") from _cause(err)

    def load_configuration(self, *args, **kwargs):
        try:
            return load(self, *args, **kwargs)
        except MissingConfigException as err:
            path, options = err.missing_cfg_file or "", err.options
            if not options or "/" not in path:
                raise
            from runner.config.suggest import option_problem

            lines = str(err).splitlines()
            searched = [line.split("path=", 1)[1] for line in lines if "path=" in line]
            group, _, name = path.rpartition("/")
            problem = option_problem(group, name, list(options), lines[0].strip(), searched)
            raise MissingConfigException(f"Error: {problem}", missing_cfg_file=path, options=options) from _cause(err)

    setattr(load_configuration, _MARK, True)
    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(apply_overrides)
    ConfigLoaderImpl.load_configuration = load_configuration


TRAILER = re.compile(r",? set env var HYDRA_FULL_ERROR=1 to see chained exception\.?")  # Hydra's advice, in its message


def _compact_errors_without_trailer() -> None:
    import sys

    try:
        from hydra._internal import utils
        from hydra.errors import CompactHydraException, InstantiationException
        from omegaconf.errors import OmegaConfBaseException
    except ImportError:
        return
    report = utils.run_and_report
    if getattr(report, _MARK, False):
        return

    def full_error() -> bool:  # what Hydra's own run_and_report asks before it shortens an error
        return os.environ.get("HYDRA_FULL_ERROR") == "1" or utils.is_under_debugger()

    def run_and_report(func):
        try:
            return func()
        except OmegaConfBaseException as err:  # --cfg job --resolve: an interpolation that cannot be resolved
            from runner.config.interpolation import explain

            text = explain(err, overrides=sys.argv[1:])
            if text is None or full_error():
                raise
            sys.stderr.write(f"Error: {text}{os.linesep}")
            sys.exit(2)
        except CompactHydraException as err:  # Hydra's own printing of these, without its last line
            if full_error():
                raise
            text = TRAILER.sub("", str(err)).strip()
            if isinstance(err, InstantiationException):  # a hydra.callbacks entry: a config error, named by its key
                head, _, key = text.partition("\nfull_key: ")
                sys.stderr.write(
                    f"Error: {key.strip() or 'a _target_ Hydra makes'}: {head.strip().rstrip('.')}. Give it the "
                    f"_target_ of a class Hydra can import (for hydra.callbacks: a hydra.experimental.callback.Callback)."
                    + os.linesep
                )
                sys.exit(2)
            twice = re.match(r"Multiple values for ([\w/.]+)\. To override a value use 'override \1: (.*)'$", text)
            if twice:  # +strategy=mirrored: Hydra's advice is for a defaults list, not the command line
                group, value = twice.groups()
                text = (
                    f"+{group}={value} adds a second {group}, and the config has one already: choose it with "
                    f"{group}={value} (without the +)."
                )
            if isinstance(err.__cause__, OmegaConfBaseException):
                text += f" ({str(err.__cause__).strip()})"
            text = " ".join(line.strip() for line in text.splitlines() if line.strip())  # one paragraph
            sys.stderr.write((text if text.startswith("Error: ") else f"Error: {text}") + os.linesep)
            sys.exit(1)

    setattr(run_and_report, _MARK, True)
    utils.run_and_report = run_and_report


def hydra_args(argv):
    """`argv` as Hydra's own argparse parser reads its flags (abbreviated `--multi`, attached `-cjob` included): the
    namespace and the words it leaves over (Hydra's parse_args refuses those), or None when that parser is not where
    it was or refuses the flags themselves (Hydra then says why)."""
    import contextlib
    import io

    try:
        from hydra._internal.utils import get_args_parser
    except ImportError:
        return None
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return get_args_parser().parse_known_args(list(argv))
    except (SystemExit, Exception):  # argparse's own usage error (or --version): Hydra prints it
        return None
