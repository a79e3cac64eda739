"""Config composition from conf/ itself (hydra.initialize_config_dir + compose, schemas registered): the defaults
README documents, the output directories, and the mistakes refused before TensorFlow, whether Hydra refuses them
while composing (unknown keys and options, wrong types) or the runner's checks right after."""

import json
import re

import pytest
from hydra.errors import HydraException
from omegaconf import OmegaConf

from runner import app  # noqa: F401  (app registers the `runner.or` resolver hydra.run.dir uses)
from runner.config import schema
from runner.config.validate import validate
from runner.errors import ConfigError

from helpers import ROOT, composed

schema.register()
CONF = ROOT / "conf"


def test_the_default_experiment_is_readmes():
    """README: `python -m runner` is an MLP on synthetic data, Model.fit, strategy=auto (the default strategy without
    GPUs), in this process."""
    cfg = composed()
    assert cfg.strategy.name == "auto" and cfg.cross_device_ops.name == "auto" and cfg.cluster.name == "local"
    assert cfg.model._target_ == "runner.models.mlp" and cfg.data.name == "synthetic" and cfg.executor.name == "fit"
    assert cfg.data.input == "tf_data"
    assert cfg.devices.logical_cpus == 1
    validate(cfg)
    assert cfg.strategy.name in ("default", "one_device", "mirrored")  # as the GPUs here allow (none in CI: default)


def test_documented_defaults():
    cfg = composed()
    assert cfg.mlflow.tracking_uri is None and cfg.mlflow.enabled is True  # None: $MLFLOW_TRACKING_URI, else ./mlflow.db
    assert cfg.mlflow.flush_every_sec == 5 and cfg.mlflow.delivery_timeout_sec == 120
    assert cfg.checkpoint.enabled is True and cfg.checkpoint.dir is None  # <output_dir>/checkpoints
    assert cfg.resume is None and cfg.save_model is True
    assert cfg.cluster.start_timeout_sec == 120
    localhost = composed("strategy=multi_worker_mirrored", "cluster=localhost").cluster
    assert localhost.failure_grace_sec == 5 and localhost.start_timeout_sec == 120
    assert localhost.workers == 2 and localhost.ps == 0 and localhost.evaluator is False
    assert composed("cluster=tpu").cluster.tpu == "local"


def test_every_default_has_its_schema_type():
    cfg = composed()
    for key, node in (
        ("train", schema.TrainConfig),
        ("devices", schema.DevicesConfig),
        ("mlflow", schema.MlflowConfig),
        ("checkpoint", schema.CheckpointConfig),
    ):
        assert OmegaConf.get_type(cfg[key]) is node, key  # the schema's dataclass, not a plain dict
    assert isinstance(cfg.train.epochs, int) and isinstance(cfg.train.optimizer.learning_rate, float)


def test_a_run_writes_to_a_dated_output_directory_unless_it_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # resolving them creates the directories (runner.fresh_dir): not in the checkout
    run = composed(hydra=True).hydra
    assert re.fullmatch(r"outputs/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d", run.run.dir), run.run.dir
    assert run.job.name == "runner" and run.job.chdir is False  # the log is <output_dir>/runner.log; cwd stays
    assert re.fullmatch(r"multirun/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d", run.sweep.dir)
    assert OmegaConf.to_container(run.sweep)["subdir"] == "${hydra.job.num}"  # one directory per job
    assert composed("resume=/runs/2026-11-30/10-00-00", hydra=True).hydra.run.dir == "/runs/2026-11-30/10-00-00"


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_every_preset_composes_and_validates(preset):
    cfg = composed(f"experiment={preset}")
    if preset != "strategy_sweep":  # a sweep's own config is one of its jobs', checked per job
        validate(cfg)


# --- refused before TensorFlow: by Hydra while composing, or by the runner's checks right after -----------------
def refusal(*overrides) -> str:
    """The message that refuses these overrides, from Hydra's composition or from validate()."""
    try:
        cfg = composed(*overrides)
    except HydraException as err:
        return " ".join(str(e) for e in (err, err.__cause__) if e)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    return str(err.value)


@pytest.mark.parametrize(
    "overrides,needles",
    [
        (["train.nonexistent=1"], ["train.nonexistent"]),  # an unknown key
        (["train.epochs=lots"], ["train.epochs", "lots"]),  # a wrong type
        (["data.num_examples=1.5"], ["data.num_examples", "1.5"]),
        (["strategy=nonexistent"], ["strategy/nonexistent"]),  # an unknown option
        (["executor=fast"], ["executor/fast"]),
        (["strategy.devices=[/cpu:0]"], ["strategy.devices"]),  # a key of another option (mirrored's, not default's)
        (["cluster.workers=2"], ["cluster.workers"]),  # cluster=localhost's, not cluster=local's
        (["executor.verbose=loud"], ["executor.verbose", "loud"]),
        (["data.task=ranking"], ["data.task", "ranking"]),
        # `+key=` adds a key past the schema while composing: the runner's own check refuses it, naming the keys there
        (["+train.extra=1"], ["train.extra", "epochs, steps_per_epoch"]),
        (["strategy=mirrored", "+strategy.devicez=[/cpu:0]"], ["strategy.devicez", "devices"]),
        (["+train.optimizer.momentun=0.9"], ["train.optimizer.momentun", "learning_rate"]),
        (["+stratgy=mirrored"], ["stratgy", "strategy, cross_device_ops"]),
        (["~train"], ["the config has no train (~train removes it)"]),  # a part every run reads, removed
        # XLA across logical CPUs: TensorFlow's traceback at the first step before
        (["strategy=mirrored", "devices.logical_cpus=2", "train.jit_compile=true"], ["strategy=mirrored", "logical_cpus=2"]),
        (
            ["strategy=central_storage", "devices.logical_cpus=2", "train.jit_compile=true"],
            ["strategy=central_storage", "executor=custom_loop"],
        ),
        (
            ["strategy=parameter_server", "cluster=localhost", "cluster.ps=1", "train.jit_compile=true"],
            ["train.jit_compile=true", "strategy=parameter_server", "ps tasks"],
        ),
        (["~strategy"], ["the config has no strategy", "strategy=<option>"]),
        (
            ["strategy=parameter_server", "cluster=localhost", "cluster.ps=1", "strategy.variable_partitioner.kind=weird"],
            ["strategy.variable_partitioner.kind", "weird"],
        ),
    ],
)
def test_mistakes_are_refused_naming_the_key(overrides, needles):
    message = refusal(*overrides)
    for needle in needles:
        assert needle in message, message


def test_summary_json_is_strict_json_when_a_figure_is_not_finite(tmp_path):
    cfg = OmegaConf.create({"output_dir": str(tmp_path)})
    app._written(cfg, {"steps": 0, "final_loss": float("nan"), "eval/loss": float("inf"), "run_id": "abc", "steps_per_sec": 2.5})

    def refuse(name):
        raise ValueError(f"{name} in summary.json")

    summary = json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    assert summary == {"steps": 0, "final_loss": None, "eval/loss": None, "run_id": "abc", "steps_per_sec": 2.5}


@pytest.mark.parametrize("command", ["runner.export", "runner.kubernetes"])
@pytest.mark.parametrize(
    "override,code,says",
    [
        ("data=nosuch", 1, "data=nosuch is not an option of data"),
        ("train.epochs=abc", 1, "train.epochs=abc has the wrong type for train.epochs"),
        ("trian.epochs=3", 1, "did you mean train.epochs=3?"),
        ("+train.epochs=2", 1, "train.epochs is already in the config. Set it with train.epochs=2"),
        ("~output_dir", 1, "~output_dir removes output_dir, which a run needs"),  # was Hydra's 4 lines
        ("~train.epoch", 1, "~train.epoch removes nothing: train.epoch is not in the config: did you mean ~train.epochs?"),
        ("train.epochs=${nope}", 2, "train.epochs: the interpolation refers to nope"),
        ("train.epochs=${train.epochs}", 2, "an interpolation cycle"),
        ("data.num_features=${oc.env:RUNNER_TEST_UNSET}", 2, "RUNNER_TEST_UNSET, which is not set"),
        ("~strategy", 2, "the config has no strategy (~strategy removes it)"),
        ("train.épochs=3", 2, "is not an override Hydra can read"),
    ],
)
def test_the_other_commands_refuse_a_config_as_python_m_runner_does(command, override, code, says, capsys, tmp_path):
    """python -m runner.export and runner.kubernetes compose the config as the runner does: what Hydra refuses is one
    paragraph and exit 1, an interpolation that cannot be resolved exit 2 (docs/errors.md), never a traceback."""
    import importlib

    main = importlib.import_module(command).main
    assert main([override, "--out", str(tmp_path / "out")]) == code
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and err.count("Error: ") == 1 and len(err.strip().splitlines()) == 1, err
    assert says in err, err


@pytest.mark.parametrize(
    "override,code,says",
    [
        ("data.shuffle=maybe", 1, "Error: data.shuffle=maybe has the wrong type for data.shuffle"),
        ("~checkpoint", 2, "Error: the config has no checkpoint (~checkpoint removes it)"),  # its handler read it
    ],
)
def test_a_value_of_the_wrong_type_or_a_removed_part_is_one_paragraph(override, code, says):
    """python -m runner train.epochs=abc: the key, the value, OmegaConf's reason and where the types are (exit 1);
    ~checkpoint: which part is gone (exit 2). Both were OmegaConf's lines or traceback."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "runner", override], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == code and done.stderr.startswith(says), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_export_into_a_file_names_it(tmp_path, capsys):
    from runner.export import main

    (tmp_path / "taken").write_text("")
    assert main(["--out", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert err == f"Error: {tmp_path / 'taken'}: File exists. Give --out a new directory where you can write.\n", err
