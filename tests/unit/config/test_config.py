"""Config-only behaviour: composition, schemas, validation, and no TensorFlow import on these paths."""

import pytest
from omegaconf import OmegaConf

from runner.config import schema
from runner.config.validate import validate
from runner.errors import ConfigError

from helpers import composed, runner_imports

schema.register()
OmegaConf.register_new_resolver("runner.or", lambda a, b: a or b, replace=True)


@pytest.mark.parametrize(
    "group,options",
    [
        (
            "strategy",
            ["default", "one_device", "mirrored", "central_storage", "multi_worker_mirrored", "parameter_server", "tpu"],
        ),
        ("cross_device_ops", ["auto", "nccl", "hierarchical_copy", "reduction_to_one_device", "ring"]),
        ("model", ["linear", "mlp", "cnn"]),
        ("data", ["ones", "synthetic", "digits", "npz", "tfrecord"]),
        ("executor", ["fit", "custom_loop"]),
        ("cluster", ["local", "localhost", "tf_config", "slurm", "tpu"]),
    ],
)
def test_every_option_composes_with_its_own_name(group, options):
    for option in options:
        cfg = composed(f"{group}={option}")
        node = cfg[group]
        if group == "model":
            assert node._target_ == f"runner.models.{option}"
        else:
            assert node.name == option


def test_schema_types_fields_of_the_chosen_option():
    cfg = composed("strategy=parameter_server", "strategy.variable_partitioner.num_shards=4")
    assert cfg.strategy.variable_partitioner.num_shards == 4
    assert OmegaConf.get_type(cfg.strategy).__name__ == "ParameterServerConfig"


def test_default_config_validates():
    validate(composed())


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["train.epochs=0"], "train.epochs=0"),
        (["train.global_batch_size=-4"], "train.global_batch_size=-4"),
        (["train.steps_per_epoch=0"], "train.steps_per_epoch=0"),
        (["train.optimizer.name=lbfgs"], "sgd, adam, adamw, rmsprop, adagrad"),
        (["train.loss=hinge"], "mse"),
        (["data.input=pandas"], "tf_data, numpy, from_function"),
        (["strategy=mirrored", "cross_device_ops=ring"], "strategy=multi_worker_mirrored"),
        (["strategy=multi_worker_mirrored", "cross_device_ops=hierarchical_copy"], "auto or ring or nccl"),
        (["strategy=one_device", "cross_device_ops=nccl"], "strategy=one_device takes cross_device_ops=auto"),
        (["strategy=parameter_server"], "cluster=local"),
        (["strategy=tpu"], "strategy=tpu needs cluster=tpu"),
        (["strategy=mirrored", "cluster=localhost"], "use strategy=multi_worker_mirrored or strategy=parameter_server"),
        (["strategy=parameter_server", "cluster=localhost"], "cluster.ps=1 or more"),
        (["data=npz", "data.path=/no/such/file.npz"], "/no/such/file.npz"),
        (["data=digits", "data.eval_fraction=1.5"], "data.eval_fraction=1.5"),
        (["train.profile_steps=[5,2]"], "train.profile_steps=[5, 2] must be [first, last]"),
        (["train.profile_steps=[0,2]"], "1 <= first <= last"),
        (["train.profile_steps=[3]"], "train.profile_steps=[3]"),
    ],
)
def test_validation_names_the_bad_value(overrides, needle):
    with pytest.raises(ConfigError) as err:
        validate(composed(*overrides))
    assert needle in str(err.value)


@pytest.mark.slow  # end to end: runs the runner in a subprocess
def test_config_only_commands_do_not_import_tensorflow():
    done, loaded = runner_imports(["--cfg", "job", "strategy=mirrored"])
    assert "name: mirrored" in done.stdout and loaded == []
