"""MirroredStrategy scaling on a multi-GPU machine, in one command:

    python -m benchmarks.gpu_scaling [--steps 300] [--global-batch-per-gpu 256] [--model cnn]

For N = 1..(GPUs) and each all-reduce (nccl, hierarchical_copy, reduction_to_one_device), with mixed
precision off and on, runs the runner on the first N GPUs and reports examples/sec and scaling efficiency
(examples/sec on N GPUs / (N x on 1 GPU)). The global batch grows with N (weak scaling), as the guide
advises. Fails at once, saying so, on a machine without GPUs.
"""

import argparse
import re
import subprocess
import sys
import tempfile

ALL_REDUCE = ["nccl", "hierarchical_copy", "reduction_to_one_device"]


def count_gpus() -> int:
    probe = (
        "import os; os.environ['TF_CPP_MIN_LOG_LEVEL']='3'; import tensorflow as tf; "
        "print(len(tf.config.list_physical_devices('GPU')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_scaling")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--global-batch-per-gpu", type=int, default=256)
    p.add_argument("--model", default="cnn", choices=["mlp", "cnn"])
    args = p.parse_args(argv)
    gpus = count_gpus()
    if gpus == 0:
        print(
            "Error: benchmarks.gpu_scaling needs NVIDIA GPUs, and TensorFlow sees none on this machine "
            "(install the gpu extra: pip install -e '.[gpu]'). For CPU figures run python -m benchmarks.run.",
            file=sys.stderr,
        )
        return 2
    workdir = tempfile.mkdtemp(prefix="runner-gpu-bench-")
    data = ["data=digits"] if args.model == "cnn" else []
    rows, base = [], {}
    for mixed in (False, True):
        for op in ALL_REDUCE:
            for n in range(1, gpus + 1):
                gbs = args.global_batch_per_gpu * n
                argv = [
                    sys.executable,
                    "-m",
                    "runner",
                    "strategy=mirrored",
                    f"cross_device_ops={op}",
                    f"devices.gpus=[{','.join(map(str, range(n)))}]",
                    f"model={args.model}",
                    *data,
                    f"train.global_batch_size={gbs}",
                    "train.epochs=1",
                    f"train.steps_per_epoch={args.steps}",
                    f"train.mixed_precision={str(mixed).lower()}",
                    "save_model=false",
                    "checkpoint.enabled=false",
                    "executor.verbose=0",
                    "mlflow.experiment_name=gpu_scaling",
                    f"hydra.run.dir={workdir}/{len(rows)}",
                ]
                proc = subprocess.run(argv, capture_output=True, text=True, cwd=workdir)
                match = re.search(r"training ([0-9.]+)s", proc.stdout + proc.stderr)
                if proc.returncode or not match:
                    rows.append((mixed, op, n, None, None))
                    print(f"mixed={mixed} {op} x{n}: failed\n{(proc.stdout + proc.stderr)[-1500:]}", flush=True)
                    continue
                eps = args.steps * gbs / float(match.group(1))
                base.setdefault((mixed, op), eps if n == 1 else None)
                eff = eps / (n * base[(mixed, op)]) if base.get((mixed, op)) else None
                rows.append((mixed, op, n, eps, eff))
                print(
                    f"mixed_precision={mixed} {op} x{n}: {eps:,.0f} examples/s, scaling efficiency {eff:.2f}"
                    if eff
                    else f"mixed_precision={mixed} {op} x{n}: {eps:,.0f} examples/s",
                    flush=True,
                )
    print("\n| mixed precision | all-reduce | GPUs | examples/sec | scaling efficiency |\n|---|---|---|---|---|")
    for mixed, op, n, eps, eff in rows:
        print(f"| {mixed} | {op} | {n} | {f'{eps:,.0f}' if eps else 'failed'} | {f'{eff:.2f}' if eff else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
