"""data=tfrecord end to end: runner.export writes shards from the runner's own sources, the runner trains on them
(fit and the custom loop), bad files stop it before the first step, and sharding is proven by counting records.

The proof of sharding: the exported records carry an `id`; with data.record_ids_dir each training step writes the
ids its replica consumed (runner/builders/data/tfrecord.py). Under multi_worker_mirrored (2 worker processes) one epoch
must consume every record exactly once across the workers, with disjoint sets per worker, under the file policy
(each worker its own files) and the data policy (each worker its own records). Under parameter_server the
coordinator decides how many steps each worker runs, so the check is per pass over each worker's shard: the
shards are disjoint, their union is every record, and each worker reads each record of its shard once per pass.
"""

import collections
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from helpers import ELASTIC, ROOT, LiveRun, assert_refused_run_deleted, check_elastic_run, mlflow_run_by_name

pytestmark = pytest.mark.slow  # end to end: TensorFlow, `python -m runner` and its clusters

MWMS = ["strategy=multi_worker_mirrored", "cluster=localhost", "cluster.workers=2", "cross_device_ops=ring"]
PS = ["strategy=parameter_server", "cluster=localhost", "cluster.workers=2", "cluster.ps=1"]
ELASTIC_DATA = [a for a in ELASTIC if a.startswith("data.")]
ELASTIC_TRAIN = [a for a in ELASTIC if not a.startswith("data.")]
QUIET = ["mlflow.enabled=false", "checkpoint.enabled=false", "save_model=false"]


def export(out, *overrides, shards=4, eval_shards=2):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner.export",
            *overrides,
            "--out",
            str(out),
            "--shards",
            str(shards),
            "--eval-shards",
            str(eval_shards),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """digits (1438 training records, 359 eval) and 256 synthetic records in 4 training files of 64."""
    root = tmp_path_factory.mktemp("tfrecords")
    digits = export(root / "digits", "data=digits")
    assert "wrote 1438 training and 359 eval records of data=digits" in digits.stdout
    assert digits.stderr.strip() == "", digits.stderr  # TensorFlow's C++ start-up lines (absl, CUDA) were printed
    export(root / "synthetic", "data=synthetic", "data.num_examples=256", "data.eval_examples=64")
    export(root / "elastic", "data=synthetic", *ELASTIC_DATA)  # the elastic job's: tests/helpers.py's ELASTIC data
    return root


def tfrecord(directory):
    return ["data=tfrecord", f"data.train_files={directory}/train-*.tfrecord", f"data.eval_files={directory}/eval-*.tfrecord"]


def test_export_writes_what_the_pure_reader_reads(files):
    from test_tfrecord_source import data_cfg

    from runner.sources.tfrecord import load_source
    from runner.sources.tfrecord_format import count_records, example_features, first_record

    source = load_source(data_cfg(train_files=str(files / "digits" / "train-*"), features=None, label=None, num_classes=None))
    assert source.input_shape == (64,) and source.num_outputs == 10 and source.train_records == 1438
    assert sum(count_records(f) for f in source.train_files) == 1438  # counted, not taken from tfrecord.json
    assert example_features(first_record(source.train_files[1])) == {"x": ("float", 64), "y": ("int64", 1), "id": ("int64", 1)}


def test_an_npz_file_exports_and_trains(runner, tmp_path):
    """A user's .npz (regression, no eval arrays: the held-out fraction becomes the eval files) round-trips."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 5)).astype("float32")
    np.savez(tmp_path / "mine.npz", x_train=x, y_train=(x @ np.arange(5.0)).reshape(-1, 1).astype("float32"))
    out = tmp_path / "mine"
    export(out, "data=npz", f"data.path={tmp_path}/mine.npz", "data.task=regression", shards=3, eval_shards=1)
    spec = json.loads((out / "tfrecord.json").read_text())
    assert spec["task"] == "regression" and spec["features"]["y"] == {"dtype": "float32", "shape": [1]}
    assert sum(c for name, (c, _) in spec["records"].items() if name.startswith("train")) == 160
    result = runner("tfr-npz", [*tfrecord(out), "model=linear", "train.global_batch_size=32", *QUIET])
    assert result.returncode == 0, result.output[-3000:]
    assert "done: 10 steps" in result.output  # 2 epochs x 160 // 32


def test_training_on_tfrecord_files_fit_and_custom_loop(runner, files):
    common = [*tfrecord(files / "digits"), "train.epochs=2", "train.global_batch_size=64", "train.optimizer.learning_rate=0.3"]
    done = runner.many(
        {
            "tfr-fit": [*common, "executor=fit"],
            "tfr-loop-from-function": [
                *common,
                "executor=custom_loop",
                "data.input=from_function",
                "strategy=mirrored",
                "devices.logical_cpus=2",
            ],
        }
    )
    for name, result in done.items():
        assert result.returncode == 0, f"{name}:\n{result.output[-3000:]}"
        assert "done: 44 steps" in result.output, result.output[-2000:]  # 2 epochs x 1438 // 64, from tfrecord.json
        accuracy = float(re.search(r"eval/accuracy=([0-9.]+)", result.output).group(1))
        assert accuracy > 0.5, result.output[-2000:]  # 10 classes: chance is 0.1


def test_bad_files_stop_before_the_first_step(runner, files, tmp_path):
    text = tmp_path / "notes.tfrecord"
    text.write_text("not a record\n" * 20)
    cases = {
        "no-match": (["data=tfrecord", f"data.train_files={tmp_path}/none-*.tfrecord"], "matches no file"),
        "not-tfrecord": (
            [
                "data=tfrecord",
                f"data.train_files={text}",
                "data.features={x: {dtype: float32, shape: [3]}, y: {dtype: int64, shape: []}}",
                "data.label=y",
                "data.num_classes=2",
            ],
            "is not a TFRecord file",
        ),
        "missing-feature": (
            [
                *tfrecord(files / "digits"),
                "data.features={x: {dtype: float32, shape: [64]}, y: {dtype: int64, shape: []}, w: {dtype: float32, shape: []}}",
            ],
            "data.features.w: the records of",
        ),
        "wrong-dtype": (
            [*tfrecord(files / "digits"), "data.features={x: {dtype: int64, shape: [64]}, y: {dtype: int64, shape: []}}"],
            "data.features.x.dtype=int64",
        ),
    }
    done = runner.many({name: [*args, *QUIET] for name, (args, _) in cases.items()}, timeout=120)
    for name, (_, needle) in cases.items():
        result = done[name]
        assert result.returncode == 2, f"{name}: {result.output[-2000:]}"
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and needle in errors[0], result.stderr[-2000:]
        assert "Traceback" not in result.output


def damage_record(path, number) -> int:
    """Flip a byte in the data of record `number` of a TFRecord file; returns the record's offset."""
    import struct

    blob = bytearray(path.read_bytes())
    offset = 0
    for _ in range(number):
        offset += 16 + struct.unpack("<Q", blob[offset : offset + 8])[0]
    blob[offset + 12] ^= 0xFF
    path.write_bytes(bytes(blob))
    return offset


def test_a_record_damaged_mid_file_is_named_and_data_verify_finds_it_first(runner, files, tmp_path):
    """A checksum broken at record 100 of the second training file: met in the first epoch, it ends the run with
    exit 5 naming the file and record (not TensorFlow's trace after training); data.verify=true finds it before."""
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(files / "digits", damaged)
    offset = damage_record(damaged / "train-00001-of-00004.tfrecord", 100)
    args = [*tfrecord(damaged), "train.epochs=2", "mlflow.experiment_name=damaged-data"]
    done = runner.many({"damaged-train": args, "damaged-verify": [*args, "data.verify=true"]})
    where = f"{damaged}/train-00001-of-00004.tfrecord (data.train_files), record 100"
    trained = done["damaged-train"]
    assert trained.returncode == 5 and "Traceback" not in trained.output, trained.output[-3000:]
    (error,) = [line for line in trained.stderr.splitlines() if line.startswith("Error:")]
    assert where in error and f"corrupted record at {offset + 12} (DataLossError)" in error, error
    assert f"python -m runner resume={trained.run_dir}" in error
    _, run = mlflow_run_by_name(runner.uri, "damaged-data", "damaged-train")
    assert run.info.status == "FAILED" and "record 100" in run.data.tags["error"]  # it trained: kept, not deleted
    assert run.info.lifecycle_stage == "active" and (trained.run_dir / "mlflow_run_id").is_file()
    verified = done["damaged-verify"]
    assert verified.returncode == 5 and "Traceback" not in verified.output, verified.output[-3000:]
    (error,) = [line for line in verified.stderr.splitlines() if line.startswith("Error:")]
    assert error.startswith(
        f"Error: data.verify: {damaged}/train-00001-of-00004.tfrecord (data.train_files) cannot be read at record 100"
    )
    assert "nothing was trained" in error and "training with" not in verified.output
    assert_refused_run_deleted(runner.uri, "damaged-data", "damaged-verify", verified, "data.verify: ")  # exit 5, refused


def consumed(ids_dir):
    """{worker: [ids in the order its replicas consumed them]} from every task's id log."""
    by_worker = collections.defaultdict(list)
    for path in sorted(ids_dir.glob("*.txt")):
        for step in path.read_text().split("ids")[1:]:  # "ids <replica> [<worker> <id> <worker> <id> ...]" per step
            numbers = [int(n) for n in re.findall(r"-?\d+", step)]
            pairs = numbers[1:]  # after the replica: (worker, id) pairs
            for worker, record in zip(pairs[::2], pairs[1::2]):
                by_worker[worker].append(record)
    return dict(by_worker)


SHARDED = ["train.global_batch_size=16", "data.shuffle=false", *QUIET]


@pytest.mark.parametrize(
    "policy,executor,input",
    [
        ("file", "fit", "tf_data"),
        ("data", "custom_loop", "tf_data"),
        ("file", "custom_loop", "from_function"),
        ("off", "fit", "tf_data"),
    ],
)
def test_mwms_workers_read_disjoint_records_covering_the_epoch_once(runner, files, tmp_path, policy, executor, input):
    """tf_data: TensorFlow's auto-shard rewrite with the policy; from_function: the runner's own dataset_fn."""
    ids = tmp_path / "ids"
    result = runner(
        f"mwms-{policy}-{executor}-{input}",
        [
            *MWMS,
            f"executor={executor}",
            f"data.input={input}",
            *tfrecord(files / "synthetic"),
            *SHARDED,
            "train.epochs=1",
            f"data.shard_policy={policy}",
            f"data.record_ids_dir={ids}",
        ],
        timeout=300,
    )
    assert result.returncode == 0, result.output[-3000:]
    reads = consumed(ids)
    assert sorted(reads) == [0, 1], reads.keys()
    a, b = set(reads[0]), set(reads[1])
    if policy == "off":  # the control: unsharded, both workers read the same records, and the count shows it
        assert a == b, (len(a), len(b), len(a & b))
        print(f"mwms off (control): both workers read the same {len(a)} records")
        return
    assert not a & b, f"records read by both workers: {sorted(a & b)[:10]}"
    every = collections.Counter(reads[0] + reads[1])
    assert sorted(every) == list(range(256)) and set(every.values()) == {1}, every.most_common(3)
    if policy == "file":  # whole files: contiguous blocks of 64 ids (runner.export)
        assert {i // 64 for i in a}.isdisjoint({i // 64 for i in b})
    print(f"mwms {policy} {executor} {input}: worker 0 read {len(a)}, worker 1 {len(b)}, union {len(a | b)} of 256, each once")


@pytest.mark.parametrize("policy,executor", [("file", "custom_loop"), ("data", "fit")])
def test_parameter_server_workers_read_disjoint_shards(runner, files, tmp_path, policy, executor):
    ids = tmp_path / "ids"
    result = runner(
        f"ps-{policy}-{executor}",
        [
            *PS,
            f"executor={executor}",
            *tfrecord(files / "synthetic"),
            *SHARDED,
            "train.epochs=4",
            f"data.shard_policy={policy}",
            f"data.record_ids_dir={ids}",
        ],
        timeout=300,
    )
    assert result.returncode == 0, result.output[-3000:]
    reads = consumed(ids)
    assert sorted(reads) == [0, 1], reads.keys()
    shards = {w: set(r) for w, r in reads.items()}
    assert not shards[0] & shards[1]
    assert shards[0] | shards[1] == set(range(256)), f"{len(shards[0] | shards[1])} of 256 records read"
    for worker, order in reads.items():
        size = len(shards[worker])
        assert len(order) >= size and len(set(order[:size])) == size, f"worker {worker}: a record twice in one pass"
    steps = "/".join(str(len(reads[w]) // 16) for w in (0, 1))
    print(f"ps {policy} {executor}: shards of {len(shards[0])} and {len(shards[1])} records, disjoint, union 256; steps {steps}")


def test_mirrored_on_tfrecord_files_matches_the_default_strategy(runner, files):
    import tf_keras

    common = [
        *tfrecord(files / "digits"),
        "data.shuffle=false",
        "train.epochs=1",
        "train.global_batch_size=64",
        "mlflow.enabled=false",
    ]
    done = runner.many(
        {"tfr-default": ["strategy=default", *common], "tfr-mirrored": ["strategy=mirrored", "devices.logical_cpus=2", *common]}
    )
    for name, result in done.items():
        assert result.returncode == 0, f"{name}:\n{result.output[-3000:]}"
    load = lambda name: tf_keras.models.load_model(done[name].run_dir / "model.keras", compile=False).get_weights()  # noqa: E731
    worst = 0.0
    for a, b in zip(load("tfr-mirrored"), load("tfr-default"), strict=True):
        worst = max(worst, float(np.max(np.abs(a - b)) / np.max(np.abs(b))))
    assert worst <= 1e-5, worst
    print(f"mirrored (2 replicas) vs default on TFRecord files: largest relative weight difference {worst:.2e}")


def test_an_elastic_job_on_tfrecord_files_trains_through_a_preempted_worker_to_the_weights_of_one_process(runner, files):
    """3 workers reading TFRecord files (data.shard_policy=data: each takes its share of every global batch);
    worker:1 is preempted (SIGTERM) after the first checkpoint: every worker checkpoints at the step they agree on, the
    job goes on with 2 from there (no step redone), grows back to 3 at the next checkpoint, and ends with the weights
    of one uninterrupted process on the same files (same global batch, seed and steps) in one MLflow run that says so.
    Model.fit, a mid-epoch checkpoint; README's elastic command (a worker killed) is Model.fit's on in-memory data,
    tests/e2e/test_ray.py (an actor killed) the custom loop's on Ray."""
    name, experiment = "elastic-tfrecord", "tfrecord-elastic"
    run_dir = runner.root / "runs" / name
    data = [*tfrecord(files / "elastic"), "data.shard_policy=data", *ELASTIC_TRAIN, "executor=fit"]
    args = [
        "strategy=multi_worker_mirrored",
        "cluster=localhost",
        "cluster.workers=3",
        "cross_device_ops=ring",
        "cluster.elastic.enabled=true",
        "cluster.elastic.rejoin_after_sec=0",
        *data,
        f"mlflow.experiment_name={experiment}",
        f"mlflow.run_name={name}",
    ]
    live = LiveRun(args, runner.root, run_dir, runner.uri)
    line = live.wait_for(lambda line: "started worker:1 (pid" in line, 120)
    victim = int(re.search(r"pid (\d+)", line).group(1))
    live.wait_for(lambda line: re.search(r"\[worker:0\].* epoch 2/12 step (8|12)/16", line), 240)  # past step 16's checkpoint
    os.kill(victim, signal.SIGTERM)
    code, output = live.finish(timeout=300)
    assert code == 0, output[-4000:]
    said = "\n".join(line for line in output.splitlines() if "cluster.elastic" in line or "[worker:0]" in line)
    assert "cluster.elastic: worker:1 preempted (SIGTERM)" in output and "going on with 2 worker(s)" in output, said
    assert "the lost worker's slot is back" in output and "training again on 3 worker(s)" in output, said
    reference = runner("elastic-tfrecord-reference", ["strategy=default", *data, f"mlflow.experiment_name={experiment}"])
    assert reference.returncode == 0, reference.output[-3000:]
    job_model = run_dir / "worker-0" / "model.keras"
    _, lost, back = check_elastic_run(runner.uri, experiment, name, job_model, reference.run_dir / "model.keras")
    assert lost["why"] == "worker:1 preempted (SIGTERM)" and lost["steps_redone"] == 0 and lost["checkpoint_step"] > 16
    print(f"TFRecord, fit: shrink {lost['resize_sec']:.1f}s, grow {back['resize_sec']:.1f}s, redone {lost['steps_redone']}")
