"""`python -m runner ...`: compose the Hydra config and run one experiment."""

from runner import env

env.prepare()

from runner import teardown  # noqa: E402
from runner.app import main  # noqa: E402  (env must be prepared before anything touches TensorFlow)

if __name__ == "__main__":
    import sys

    from runner.app import output_dir_problem

    problem = output_dir_problem(sys.argv[1:])
    if problem:
        print(f"Error: {problem}", file=sys.stderr)
        sys.exit(2)
    try:
        main()
    except SystemExit as done:  # Hydra and the runner exit through SystemExit; the code is kept
        teardown.exit(done.code)
    teardown.exit(0)
