"""data=tfrecord at scale: a training set several times larger than the memory the run may use, and the throughput
of streaming files against the same records held in memory.

    python -m benchmarks.scale --dir /tmp/scale                   # ~6 GB on disk, 1.5 GB limit, then the A/B; ~25 min
    python -m benchmarks.scale --dir /tmp/scale --quick           # 60 MB, 1 GB limit, 1 round: checks that it runs

1. Bounded: `python -m runner data=tfrecord` trains one epoch over --gb of records inside a cgroup (v1 memory
   controller, as root) whose limit is --limit-gb for the whole process tree (the runner and its MLflow process).
   The resident memory of each process is sampled every 0.5 s; the cgroup's peak, failcnt and OOM kills are read
   at the end. Page cache is charged to a cgroup too, but it is reclaimed under the limit; a process that held the
   data would be OOM-killed instead.
2. Throughput: the same --ab-records records as data=npz (in memory) and data=tfrecord (streamed), same steps,
   interleaved rounds, medians: whole-process wall time and training examples per second (from the runner's
   `phases:` line).

Records are tf.train.Example with `x` (float32 [--dim]), `y` (int64 class of a linear map of x) and `id`,
encoded here directly (protobuf wire format) so that writing GBs takes minutes, not hours.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

CLASSES = 10
CGROUP = "/sys/fs/cgroup/memory/runner-scale-bench"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _entry(name: str, feature: bytes) -> bytes:  # map<string, Feature> entry: key 1, value 2
    return _len_field(1, _len_field(1, name.encode()) + _len_field(2, feature))


def example(x: np.ndarray, y: int, i: int) -> bytes:
    floats = _len_field(2, _len_field(1, x.astype("<f4").tobytes()))  # Feature.float_list, packed
    label = _len_field(3, _len_field(1, _varint(y)))  # Feature.int64_list, packed
    ident = _len_field(3, _len_field(1, _varint(i)))
    return _len_field(1, _entry("x", floats) + _entry("y", label) + _entry("id", ident))


def generate(out: str, records: int, dim: int, shards: int, eval_records: int, seed: int = 0, npz: bool = False) -> dict:
    """TFRecord shards (and tfrecord.json) of `records` examples, written chunk by chunk: never all in memory."""
    from runner import env

    env.prepare()
    import tensorflow as tf

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(dim, CLASSES)).astype("float32")
    written, keep = {}, {"train": [], "eval": []}
    for split, n, nshards in (("train", records, shards), ("eval", eval_records, 1)):
        for s in range(nshards):
            lo, hi = s * n // nshards, (s + 1) * n // nshards
            name = f"{split}-{s:05d}-of-{nshards:05d}.tfrecord"
            with tf.io.TFRecordWriter(os.path.join(out, name)) as writer:
                for start in range(lo, hi, 4096):
                    x = rng.normal(size=(min(4096, hi - start), dim)).astype("float32")
                    y = np.argmax(x @ w, axis=1)
                    for j in range(len(x)):
                        writer.write(example(x[j], int(y[j]), start + j))
                    if npz:
                        keep[split].append((x, y))
            written[name] = [hi - lo, os.path.getsize(os.path.join(out, name))]
            print(f"  {name}: {hi - lo} records", flush=True)
    spec = {
        "features": {"x": {"dtype": "float32", "shape": [dim]}, "y": {"dtype": "int64", "shape": []}},
        "label": "y",
        "task": "classification",
        "num_classes": CLASSES,
        "source": "benchmarks.scale",
        "records": written,
    }
    with open(os.path.join(out, "tfrecord.json"), "w") as f:
        json.dump(spec, f, indent=1)
    if npz:
        cat = {s: (np.concatenate([c[0] for c in keep[s]]), np.concatenate([c[1] for c in keep[s]])) for s in keep}
        np.savez(os.path.join(out, "same.npz"), x_train=cat["train"][0], y_train=cat["train"][1], x_eval=cat["eval"][0],
                 y_eval=cat["eval"][1])  # fmt: skip
    return spec


def runner_argv(data_args, steps, gbs, workdir, n):
    return [
        sys.executable, "-m", "runner", *data_args, "train.epochs=1", f"train.steps_per_epoch={steps}",
        f"train.global_batch_size={gbs}", "executor.verbose=0", f"hydra.run.dir={workdir}/runs/{n}",
        f"mlflow.tracking_uri=sqlite:///{workdir}/scale.db", "mlflow.experiment_name=scale",
    ]  # fmt: skip


def _anon_rss(pid: int) -> tuple[int, int]:
    """Anonymous resident memory (RssAnon: what a process holds itself, not the shared libraries or the page cache
    of the files it reads) of the training process and of its children (the MLflow process)."""
    import psutil

    def anon(p):
        with open(f"/proc/{p}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))

    try:
        return anon(pid), sum(anon(c.pid) for c in psutil.Process(pid).children(recursive=True))
    except (psutil.Error, OSError, StopIteration):
        return 0, 0


def bounded(argv, limit_bytes: int, cwd: str) -> dict:
    """Run argv in a fresh memory cgroup limited to limit_bytes; sample the tree's RSS."""
    if os.path.isdir(CGROUP):
        os.rmdir(CGROUP)
    os.mkdir(CGROUP)
    try:
        with open(f"{CGROUP}/memory.limit_in_bytes", "w") as f:
            f.write(str(limit_bytes))

        def enter():
            with open(f"{CGROUP}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

        samples, started = [], time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, preexec_fn=enter, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = []
        reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
        reader.start()
        while proc.poll() is None:
            samples.append((time.perf_counter() - started, _anon_rss(proc.pid)))
            time.sleep(0.5)
        wall = time.perf_counter() - started
        reader.join(5)

        def read(name):
            with open(f"{CGROUP}/{name}") as f:
                return f.read()

        oom = dict(line.split() for line in read("memory.oom_control").splitlines())
        return {
            "rc": proc.returncode,
            "wall": wall,
            "samples": samples,
            "peak": int(read("memory.max_usage_in_bytes")),
            "failcnt": int(read("memory.failcnt")),
            "oom_kills": int(oom.get("oom_kill", 0)),
            "output": "".join(out),
        }
    finally:
        for _ in range(20):
            try:
                os.rmdir(CGROUP)
                break
            except OSError:
                time.sleep(0.5)


def training_sec(output: str) -> float:
    found = re.search(r"done: .*?training ([0-9.]+)s", output)
    if not found:
        raise RuntimeError("no `done:` line in the runner's output:\n" + output[-3000:])
    return float(found.group(1))


def timed(argv, cwd):
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - started
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall, training_sec(proc.stdout + proc.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True, help="where the records, runs and MLflow store go")
    p.add_argument("--gb", type=float, default=6.0, help="training set size on disk for the bounded run")
    p.add_argument("--limit-gb", type=float, default=1.5, help="memory limit of the bounded run's process tree")
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=1, help="epochs of the bounded run")
    p.add_argument("--gbs", type=int, default=1024, help="global batch size")
    p.add_argument("--ab-records", type=int, default=131072)
    p.add_argument("--ab-steps", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--skip-bounded", action="store_true")
    p.add_argument("--skip-ab", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.gb, a.limit_gb, a.ab_records, a.ab_steps, a.rounds = 0.06, 1.0, 4096, 20, 1
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    os.environ.clear()
    os.environ.update(env)
    record_bytes = len(example(np.zeros(a.dim, "float32"), CLASSES - 1, 10**6)) + 16
    if not a.skip_bounded:
        big = os.path.join(a.dir, "big")
        records = int(a.gb * 1e9 / record_bytes)
        if not os.path.isfile(os.path.join(big, "tfrecord.json")):
            print(f"writing {records} records ({a.gb} GB) to {big}", flush=True)
            generate(big, records, a.dim, shards=64, eval_records=4096)
        on_disk = sum(os.path.getsize(os.path.join(big, f)) for f in os.listdir(big) if f.startswith("train-"))
        steps = records // a.gbs
        argv_ = [*runner_argv(
            ["data=tfrecord", f"data.train_files={big}/train-*.tfrecord", f"data.eval_files={big}/eval-*.tfrecord"],
            steps, a.gbs, a.dir, f"bounded-{time.time():.0f}",
        ), f"train.epochs={a.epochs}"]  # fmt: skip
        print(f"bounded: {a.epochs} x {steps} steps over {on_disk / 1e9:.2f} GB, limit {a.limit_gb} GB", flush=True)
        r = bounded(argv_, int(a.limit_gb * 2**30), a.dir)
        print(f"  exit {r['rc']}, wall {r['wall']:.1f} s, cgroup peak {r['peak'] / 2**20:.0f} MiB "
              f"(failcnt {r['failcnt']}, OOM kills {r['oom_kills']})")  # fmt: skip
        print(f"  data on disk / limit: {on_disk / (a.limit_gb * 2**30):.1f}x")
        for i, who in ((0, "the training process"), (1, "its children (MLflow)")):
            rss = [s[i] for _, s in r["samples"]]
            deciles = [rss[min(len(rss) - 1, len(rss) * k // 10)] / 2**20 for k in range(1, 10)]
            print(f"  anonymous RSS of {who} at 10%, 20%, ... 90% of the run: {', '.join(f'{d:.0f}' for d in deciles)} MiB")
        with open(os.path.join(a.dir, "bounded-rss.tsv"), "w") as f:
            f.writelines(f"{t:.1f}\t{m[0] >> 20}\t{m[1] >> 20}\n" for t, m in r["samples"])
        if r["rc"] == 0:
            train = training_sec(r["output"])
            examples, read = a.epochs * steps * a.gbs, a.epochs * on_disk
            print(f"  training {train:.1f} s, {examples / train:.0f} examples/s, {read / train / 1e6:.0f} MB/s")
        else:
            print(r["output"][-3000:])
    if not a.skip_ab:
        ab = os.path.join(a.dir, "ab")
        if not os.path.isfile(os.path.join(ab, "same.npz")):
            print(f"writing {a.ab_records} records to {ab} (TFRecord and .npz)", flush=True)
            generate(ab, a.ab_records, a.dim, shards=16, eval_records=2048, seed=1, npz=True)
        sides = {
            "npz (memory)": ["data=npz", f"data.path={ab}/same.npz"],
            "tfrecord (files)": [
                "data=tfrecord", f"data.train_files={ab}/train-*.tfrecord", f"data.eval_files={ab}/eval-*.tfrecord"
            ],
        }  # fmt: skip
        results = {k: [] for k in sides}
        for rnd in range(a.rounds):
            order = list(sides)[rnd % 2 :] + list(sides)[: rnd % 2]
            for name in order:
                wall, train = timed(runner_argv(sides[name], a.ab_steps, a.gbs, a.dir, f"ab-{time.time():.0f}-{name[:3]}"), a.dir)
                results[name].append((wall, train))
                print(f"  round {rnd + 1} {name}: wall {wall:.1f} s, training {train:.1f} s", flush=True)
        print(f"A/B: {a.ab_records} records x {a.dim} floats, {a.ab_steps} steps x {a.gbs}, {a.rounds} rounds, medians")
        for name, rows in results.items():
            wall, train = statistics.median(w for w, _ in rows), statistics.median(t for _, t in rows)
            print(f"  {name:17s} wall {wall:6.1f} s  training {train:6.1f} s  {a.ab_steps * a.gbs / train:8.0f} examples/s")
        (wm, tm), (wf, tf_) = ([statistics.median(v[i] for v in rows) for i in (0, 1)] for rows in results.values())
        print(f"  files / memory: wall speed {wm / wf:.2f}, training throughput {tm / tf_:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
