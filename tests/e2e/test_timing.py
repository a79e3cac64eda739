"""time/* and summary/examples_per_sec in MLflow hold up against the process's own clock.

The test times the whole `python -m runner` process itself, reads the `phases:` line the run prints last and
the figures the run logged, and checks each figure against the intervals README says it covers.
"""

import re
import sys
import time

import pytest

from helpers import run_runner

pytestmark = pytest.mark.slow

STEPS, BATCH = 400, 64
TOL = 0.011  # the phases line prints hundredths


def phases_of(output: str) -> dict:
    line = re.search(r"phases: (.*)", output).group(1)
    return {name: float(sec) for name, sec in re.findall(r"([a-z ]+?) (\d+\.\d+)s(?:, |$)", line)}


@pytest.mark.parametrize("executor", ["fit", "custom_loop"])
def test_logged_times_match_the_process_clock(executor, store, tmp_path):
    from mlflow import MlflowClient

    root, uri = store
    args = [
        f"executor={executor}",
        "train.epochs=1",
        f"train.steps_per_epoch={STEPS}",
        f"train.global_batch_size={BATCH}",
        f"data.num_examples={STEPS * BATCH}",
        "checkpoint.enabled=false",
        "mlflow.experiment_name=timing",
        f"mlflow.run_name=timing-{executor}",
    ]
    began = time.monotonic()
    result = run_runner(args, cwd=root, run_dir=tmp_path / "run", tracking_uri=uri)
    wall = time.monotonic() - began
    assert result.returncode == 0, result.output[-3000:]
    phases = phases_of(result.output)
    assert list(phases) == ["imports", "mlflow start", "build", "first step", "train", "evaluation", "save", "mlflow end"]
    client = MlflowClient(uri)
    run = client.search_runs(
        [client.get_experiment_by_name("timing").experiment_id], filter_string=f"attributes.run_name = 'timing-{executor}'"
    )[0]
    m = run.data.metrics

    # The phases logged to MLflow are the ones printed (all but the last, which ends the run).
    for name, sec in phases.items():
        if name != "mlflow end":
            assert m[f"time/phase/{name.replace(' ', '_')}_sec"] == pytest.approx(sec, abs=TOL), name
    # Phases count from process start: together they fit in the wall time the test measured around the process.
    assert sum(phases.values()) <= wall
    # time/to_first_step_sec: from process start to the end of the first step.
    assert m["time/to_first_step_sec"] == pytest.approx(
        phases["imports"] + phases["mlflow start"] + phases["build"] + phases["first step"], abs=4 * TOL
    )
    # time/first_step_sec: the first step (tracing included), within the first-step phase (which adds the call's set-up).
    assert 0 < m["time/first_step_sec"] <= phases["first step"] + TOL
    # time/train_sec: the training call to the end of its last step: the first step and the training phase, less
    # what comes after the last step inside them (the input pipeline's teardown).
    training = phases["first step"] + phases["train"]
    assert m["time/first_step_sec"] < m["time/train_sec"] <= training + 2 * TOL
    # summary/examples_per_sec: the examples of the steps after the first call over the time from the end of that
    # call to the end of step N. That time lies within time/train_sec less the first call: the rate is neither
    # inflated nor diluted.
    first_call = int(re.search(r"\((\d+) per tf\.function call", result.output).group(1))
    timed = (STEPS - first_call) * BATCH / m["summary/examples_per_sec"]
    after_first = m["time/train_sec"] - m["time/first_step_sec"]
    # Below it by what follows the last step inside time/train_sec (the epoch's end in Keras, tens of ms): a fifth of
    # it, or 50 ms where the steps after the first call are that short (300 steps of 100 a call: about 50 ms here).
    assert min(0.8 * after_first, after_first - 0.05) <= timed <= after_first + TOL, (timed, after_first)
    assert m["summary/examples_per_sec_per_replica"] == pytest.approx(m["summary/examples_per_sec"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
