"""A sweep job's child run is named by its values of the swept keys (runner.sweeps.run_names), never a random name."""

from runner.sweeps.run_names import job_run_name, swept_keys

from helpers import composed


def test_the_swept_keys_come_from_the_command_line_and_the_sweepers_params():
    assert swept_keys(["strategy=one_device,mirrored", "executor=fit,custom_loop", "devices.logical_cpus=4"], None) == [
        "strategy",
        "executor",
    ]
    params = composed("experiment=tune_lr", hydra=True).hydra.sweeper.params
    assert swept_keys(["experiment=tune_lr", "data=digits"], params) == [
        "train.optimizer.learning_rate",
        "train.optimizer.schedule.warmup_steps",
        "train.optimizer.weight_decay",
        "train.global_batch_size",
    ]
    assert swept_keys(["+model.alpha=choice(0.35,0.5)"], {}) == ["model.alpha"]


def test_a_job_is_named_by_its_values_of_them():
    keys = ["strategy", "executor"]
    assert job_run_name(["strategy=mirrored", "executor=fit", "devices.logical_cpus=4"], keys) == "strategy=mirrored executor=fit"
    trial = ["train.optimizer.learning_rate=0.03028525153605885", "train.global_batch_size=128", "experiment=tune_lr"]
    assert job_run_name(trial, ["train.optimizer.learning_rate", "train.global_batch_size"]) == (
        "learning_rate=0.03029 global_batch_size=128"
    )
    both = job_run_name(["a.rate=1e-05", "b.rate=2"], ["a.rate", "b.rate"])
    assert both == "a.rate=1e-05 b.rate=2"  # the same last part twice: the whole keys
    assert job_run_name(["data=digits"], keys) is None  # nothing swept here: the sweep names it job-<n>
    assert len(job_run_name([f"strategy={'x' * 500}"], keys)) == 200
