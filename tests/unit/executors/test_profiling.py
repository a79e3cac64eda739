"""train.profile_steps: which calls the trace covers (runner/executors/profiling.py), and end to end, a real TensorFlow
profiler trace logged as the run's `profile` artifact for both executors."""

import pytest

from runner.executors.profiling import Profile

from helpers import FAST


class Recorded(Profile):
    """The window logic, with the profiler's start and stop recorded instead of run."""

    def __init__(self, steps):
        super().__init__(steps, "/out")
        self.calls = []

    def _start(self):
        self.calls.append("start")

    def _stop(self):
        self.calls.append("stop")


def covered(steps, calls):
    """Run `calls` (steps per call) through the profile; the steps that ran while it traced."""
    p, step, traced = Recorded(steps), 0, []
    for n in calls:
        p.before(step + 1, n)
        traced += list(range(step + 1, step + n + 1)) if p.active else []
        step += n
        p.after(step)
    p.stop()
    assert p.calls in ([], ["start", "stop"])
    return traced


@pytest.mark.parametrize(
    "steps,calls,traced",
    [
        ([2, 4], [1] * 6, [2, 3, 4]),
        ([3, 3], [1] * 6, [3]),
        ([3, 6], [2] * 4, [3, 4, 5, 6]),  # calls of 2 steps: from the call that runs step 3 to the one that runs 6
        ([2, 9], [1] * 4, [2, 3, 4]),  # training ends inside the window: stopped at the end
        ([7, 9], [1] * 4, []),  # never reached
        (None, [1] * 4, []),
    ],
)
def test_the_trace_covers_the_calls_that_run_the_steps(steps, calls, traced):
    assert covered(steps, calls) == traced


def test_without_an_output_directory_nothing_is_traced():
    assert not Profile([1, 2], None).wanted


def artifact_files(client, run_id, path):
    for a in client.list_artifacts(run_id, path):
        yield from artifact_files(client, run_id, a.path) if a.is_dir else [a]


@pytest.mark.slow  # end to end: `python -m runner` with TensorFlow's profiler (README runs the custom loop's)
def test_a_profiler_trace_of_the_steps_is_logged_for_fit(runner):
    from mlflow import MlflowClient

    jobs = {
        f"profile-{e}": [f"executor={e}", "train.profile_steps=[2,3]", "mlflow.experiment_name=profile", *FAST] for e in ("fit",)
    }
    done = runner.many(jobs)
    client = MlflowClient(runner.uri)
    experiment = client.get_experiment_by_name("profile").experiment_id
    for name, result in done.items():
        assert result.returncode == 0, result.output[-3000:]
        assert "profiling steps 2-3 to " in result.output
        (run,) = client.search_runs([experiment], filter_string=f"attributes.run_name = '{name}'")

        found = list(artifact_files(client, run.info.run_id, "profile"))
        traces = [a for a in found if a.path.endswith(".xplane.pb")]
        assert len(traces) == 1 and traces[0].file_size > 1000, [a.path for a in found]
        assert traces[0].path.startswith("profile/plugins/profile/")  # where TensorBoard's profile plugin looks
