"""`python -m runner ...` (and the `tf-runner` script): compose the Hydra config and run one experiment."""

import atexit
import os
import signal


def _while_starting(signum, frame):
    # Ctrl-C during the imports or the checks before Hydra: nothing has started yet, and a traceback of
    # whichever import was running says nothing
    os.write(2, f"Stopped: {signal.Signals(signum).name} received while starting; nothing was left running.\n".encode())
    os._exit(128 + signum)


signal.signal(signal.SIGINT, _while_starting)

from runner import env  # noqa: E402

env.utf8_paths()

from runner.control import contract, teardown  # noqa: E402

atexit.register(teardown.after_atexit)  # first registered, so run last: see runner.control.teardown

env.prepare()
if os.environ.get(contract.SPARE):  # started ahead by a sweep: imports now, then its job's overrides on stdin
    from runner import spare

    spare.wait_for_job()

import logging  # noqa: E402
import sys  # noqa: E402

from hydra.errors import HydraException  # noqa: E402

from runner.app import main, output_dir_problem, with_resumed_overrides  # noqa: E402  (env first: before TensorFlow)
from runner.config import kubernetes_pod  # noqa: E402
from runner.config.command_line import command_problem, config_only, unreadable_override_problem  # noqa: E402
from runner.control.claims import claim_from_command_line  # noqa: E402
from runner.errors import ConfigError  # noqa: E402
from runner.preflight.probes import working_dir_problem  # noqa: E402


def cli() -> None:
    """What runs before Hydra: resume='s saved overrides, and the checks of directories Hydra writes into first."""
    try:
        problem = working_dir_problem()  # every relative path below (resume=, outputs/) is read against it
        if problem:
            raise ConfigError(problem)
        sys.argv[1:] = with_resumed_overrides(sys.argv[1:])  # Hydra reads sys.argv
        argv = sys.argv[1:]
        if not config_only(argv):  # a pod of cluster=kubernetes: its TF_CONFIG, which the directory claims read
            kubernetes_pod.from_command_line(argv)
        checks = (command_problem, unreadable_override_problem, output_dir_problem, claim_from_command_line)
        problem = next((text for check in checks if (text := check(argv))), "")
    except ConfigError as err:
        problem = str(err)
    if problem:
        print(f"Error: {problem}", file=sys.stderr)
        sys.exit(2)
    if config_only(argv):  # Hydra prints the config (or help): masked, as every log line and tag is
        from runner.config.redact import RedactingStream

        sys.stdout = RedactingStream(sys.stdout)
    logging.raiseExceptions = False  # stdout closed early (| head): a log line must not become a traceback
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on, KeyboardInterrupt is handled below
    try:
        main()
    except SystemExit as done:  # Hydra and the runner exit through SystemExit; the code is kept
        teardown.exit(done.code)
    except BrokenPipeError:  # what was printed was not all read (--help | head): nothing more to say there
        teardown.exit(teardown.SIGPIPE_EXIT)
    except KeyboardInterrupt as err:  # before the app ran (Hydra composing), or a sweep between its jobs
        for held in (signal.SIGINT, signal.SIGTERM):  # a second press waits for the end: a traceback left runs RUNNING
            signal.signal(held, signal.SIG_IGN)
        signum = getattr(err, "signum", signal.SIGINT)
        from runner.sweeps.sweep import kill_parent_run

        kill_parent_run(signum)
        print(f"Stopped: {signal.Signals(signum).name} received; nothing was left running.", file=sys.stderr)
        teardown.exit(128 + signum)
    except HydraException as err:  # --help with a bad override: Hydra's help path reports no error of its own
        text = str(err)
        print(text if text.startswith("Error: ") else f"Error: {text}", file=sys.stderr)
        teardown.exit(1)
    teardown.exit(0)


if __name__ == "__main__":
    cli()
