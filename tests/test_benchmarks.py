"""The benchmark command runs end to end at tiny sizes (no timing assertions: figures are for docs/)."""

import subprocess
import sys

import pytest

from conftest import ROOT


def test_benchmark_quick_run_writes_its_table(tmp_path):
    out = tmp_path / "bench.md"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", f"--out={out}",
                           f"--tracking-uri=sqlite:///{tmp_path}/mlflow.db"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    for section in ["Runner vs hand-written", "MLflow logging on vs off", "Steps per tf.function call",
                    "Input pipeline", "`python -m runner --cfg job`", "Machine:"]:
        assert section in text
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("benchmarks").experiment_id])
    assert run.data.metrics["ratio/default/fit"] > 0 and run.data.metrics["wall/cfg_job_sec"] > 0


IN_PROCESS = {
    # module: (arguments, the ways it times, in order; the first is the reference)
    "benchmarks.paired": (["--logical-cpus=2", "--global-batch=8"], ["guide", "stacked", "written"]),
    "benchmarks.call_overhead": (["--strategy=mirrored", "--logical-cpus=2"],
                                 ["tf.function", "concrete function", "runner (concrete_per_iterator)"]),
}


@pytest.mark.parametrize("module", list(IN_PROCESS))
def test_in_process_benchmark_prints_a_row_per_way(module):
    args, ways = IN_PROCESS[module]
    proc = subprocess.run([sys.executable, "-m", module, *args, "--rounds=1", "--calls=2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.strip("| ").split(" | ") for line in proc.stdout.splitlines() if line.startswith("| ")][1:]
    assert [row[0] for row in rows] == ways
    assert float(rows[0][2]) == 1.0  # the reference against itself
