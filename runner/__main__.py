"""`python -m runner ...` (and the `tf-runner` script): compose the Hydra config and run one experiment."""

from runner import env

env.prepare()

import logging  # noqa: E402
import sys  # noqa: E402

from runner import teardown  # noqa: E402
from runner.app import main, output_dir_problem, with_resumed_overrides  # noqa: E402  (env first: before TensorFlow)
from runner.claims import in_use_problem  # noqa: E402
from runner.errors import ConfigError  # noqa: E402


def cli() -> None:
    """What runs before Hydra: resume='s saved overrides, and the checks of directories Hydra writes into first."""
    try:
        sys.argv[1:] = with_resumed_overrides(sys.argv[1:])  # Hydra reads sys.argv
        problem = output_dir_problem(sys.argv[1:]) or in_use_problem(sys.argv[1:])
    except ConfigError as err:
        problem = str(err)
    if problem:
        print(f"Error: {problem}", file=sys.stderr)
        sys.exit(2)
    logging.raiseExceptions = False  # stdout closed early (| head): a log line must not become a traceback
    try:
        main()
    except SystemExit as done:  # Hydra and the runner exit through SystemExit; the code is kept
        teardown.exit(done.code)
    except BrokenPipeError:  # what was printed was not all read (--help | head): nothing more to say there
        teardown.exit(teardown.SIGPIPE_EXIT)
    teardown.exit(0)


if __name__ == "__main__":
    cli()
