"""`python -m runner ...`: compose the Hydra config and run one experiment."""

from runner import env

env.prepare()

from runner.app import main  # noqa: E402  (env must be prepared before anything touches TensorFlow)

if __name__ == "__main__":
    main()
