"""runner/config/hydra_private.py: the private Hydra names it rewrites still exist with the shape the hooks call, and the
hooks are in place once the runner's config is registered (a Hydra release that moves them fails here, loudly)."""

import importlib
import inspect

from runner.config import hydra_private, schema


def _resolve(dotted):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_private_names_exist_with_the_arguments_the_hooks_pass():
    repository = _resolve(hydra_private.CONFIG_REPOSITORY)
    loader = _resolve(hydra_private.CONFIG_LOADER)
    assert list(inspect.signature(repository.load_config).parameters)[:2] == ["self", "config_path"]
    assert list(inspect.signature(loader._apply_overrides_to_config).parameters)[:2] == ["overrides", "cfg"]
    assert callable(loader.load_configuration)
    assert list(inspect.signature(_resolve(hydra_private.RUN_AND_REPORT)).parameters) == ["func"]
    args, left = hydra_private.hydra_args(["-m", "--cfg", "job", "--resolve", "a=1", "-cd", "d", "b=2"])  # command_line reads
    assert args.overrides == ["a=1"] and args.config_dir == "d" and left == ["b=2"]
    assert _resolve(hydra_private.ARGS_PARSER) and args.multirun and args.cfg == "job" and args.resolve
    assert not (args.run or args.help or args.hydra_help or args.shell_completion) and args.info is None


def test_install_puts_each_hook_in_place_once():
    schema.register()
    hydra_private.install()
    repository = _resolve(hydra_private.CONFIG_REPOSITORY)
    loader = _resolve(hydra_private.CONFIG_LOADER)
    assert getattr(_resolve(hydra_private.RUN_AND_REPORT), hydra_private._MARK, False)
    for hooked in (repository.load_config, loader.load_configuration, loader._apply_overrides_to_config):
        assert getattr(hooked, hydra_private._MARK, False) or hooked.__qualname__.endswith("apply_overrides")


def test_hydras_own_refusals_are_one_paragraph_with_error(capsys, monkeypatch):
    """What python -m runner printed as Hydra's bare lines ('~', '~hydra', '+strategy=mirrored'): one paragraph
    starting Error:, exit 1; +group=option names the override to write instead of Hydra's defaults-list advice."""
    import pytest
    from hydra.errors import ConfigCompositionException

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    schema.register()
    hydra_private.install()
    report = _resolve(hydra_private.RUN_AND_REPORT)
    for said, expected in (
        (
            "Could not delete 'hydra'. No match in the defaults list",
            "Error: Could not delete 'hydra'. No match in the defaults list",
        ),
        (
            "Multiple values for strategy. To override a value use 'override strategy: mirrored'",
            "Error: +strategy=mirrored adds a second strategy, and the config has one already: choose it with "
            "strategy=mirrored (without the +).",
        ),
    ):

        def compose(said=said):
            raise ConfigCompositionException(said)

        with pytest.raises(SystemExit) as done:
            report(compose)
        assert done.value.code == 1 and capsys.readouterr().err == expected + "\n"
