"""The Hydra plugin package `hydra_plugins.runner_sweeper` (pyproject maps it here): Hydra instantiates sweepers only
from `hydra_plugins.*`. The class is a thin shell over runner.sweeps.search, which holds the search itself; importing
this module imports no Optuna (Hydra imports every plugin module at start-up, --help included)."""

from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper


class RunnerOptunaSweeper(Sweeper):
    """hydra/sweeper=optuna: trials asked of an Optuna study, each a job of Hydra's configured launcher."""

    def __init__(self, **conf: Any) -> None:
        self.conf = conf  # runner.sweeps.search_config.OptunaSweeperConf's fields
        self.config = self.launcher = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )

    def sweep(self, arguments: list[str]) -> Any:
        import sys

        from runner.errors import ConfigError
        from runner.sweeps.search import run_search

        try:
            return run_search(self.conf, self.config, self.launcher, arguments)
        except ConfigError as err:  # a search it cannot run: before any trial starts, one paragraph, exit 2
            print(f"Error: {err}", file=sys.stderr)
            sys.exit(err.exit_code)
