"""The in-process benchmarks at tiny sizes (no timing assertions: figures are for docs/). `benchmarks.run` runs
from README's own commands, in tests/e2e/test_readme.py."""

import subprocess
import sys

import pytest

from helpers import ROOT

pytestmark = pytest.mark.slow  # end to end: each benchmark is a subprocess that imports TensorFlow

IN_PROCESS = {
    # module: (arguments, the ways it times, in order; the first is the reference)
    "benchmarks.paired": (["--logical-cpus=2", "--global-batch=8"], ["guide", "stacked", "written"]),
    "benchmarks.call_overhead": (
        ["--strategy=mirrored", "--logical-cpus=2"],
        ["tf.function", "concrete function", "runner (concrete_per_iterator)"],
    ),
}


@pytest.mark.parametrize("module", list(IN_PROCESS))
def test_in_process_benchmark_prints_a_row_per_way(module):
    args, ways = IN_PROCESS[module]
    proc = subprocess.run(
        [sys.executable, "-m", module, *args, "--rounds=1", "--calls=2"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.strip("| ").split(" | ") for line in proc.stdout.splitlines() if line.startswith("| ")][1:]
    assert [row[0] for row in rows] == ways
    assert float(rows[0][2]) == 1.0  # the reference against itself
