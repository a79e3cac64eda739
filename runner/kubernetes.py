"""`python -m runner.kubernetes <overrides>`: the Kubernetes manifests that run the experiment as configured, for
`kubectl apply -f`. No TensorFlow operator is needed: every pod runs the same `python -m runner` command with
cluster=kubernetes, and derives its own TF_CONFIG (runner.config.kubernetes_pod).

- multi_worker_mirrored (or strategy=auto): a headless Service and an Indexed Job of cluster.workers pods.
- parameter_server: a JobSet (jobset.x-k8s.io/v1alpha2) of a chief, cluster.workers workers and cluster.ps
  parameter servers; it succeeds when its chief does, and the other tasks exit with it (cluster.exit_with_chief).

Exit codes decide restarts: a pod that lost a peer (exit 3) or was killed is replaced, up to cluster.backoff_limit
times per pod, and continues from the last checkpoint on the shared volume; a config error (2), a loss that blew up
(4), broken data (5) or failing user code (6) fails the job at once, since a restart would fail the same way.
The manifests are validated in the tests against Kubernetes' OpenAPI schemas and the JobSet CRD.
"""

import argparse
import re
import sys

from runner.config import kubernetes_pod
from runner.config.compose import checked, composed, reported
from runner.config.redact import redact_uri
from runner.errors import ConfigError

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
FATAL_EXITS = [2, 4, 5, 6]  # runner.errors: a restart would end the same way
LABEL = "runner.tf/job"
# cluster.* keys that shape the manifests only: the pods' command does not need them
MANIFEST_ONLY = ("image", "namespace", "volume", "mount_path", "cpu", "memory", "backoff_limit")
SET_HERE = ("cluster", "strategy", "hydra.run.dir", "checkpoint.dir", "mlflow.tracking_uri")  # set again below
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei|e[0-9]+)?")  # Kubernetes' resource quantity
MAX_INDEXES = 100_000  # the most completions an Indexed Job may have
INT32 = 2**31 - 1
DEFAULT_NAME = "tf-runner"
GRACE_SEC = 30  # after SIGTERM, beyond cluster.stop_grace_sec: the pod's checkpoint and MLflow's last writes


def _refuse(text: str):
    raise ConfigError(text)


def _name(cfg) -> str:
    name = cfg.cluster.job_name or DEFAULT_NAME
    longest = f"{name}-worker-0-{max(cfg.cluster.workers, cfg.cluster.ps, 1) - 1}"  # a JobSet pod's host name
    problem = kubernetes_pod.name_problem("cluster.job_name", name, longest)
    for key in ("service", "namespace"):
        problem = problem or (cfg.cluster[key] and kubernetes_pod.name_problem(f"cluster.{key}", str(cfg.cluster[key])))
    if problem:
        _refuse(problem)
    return name


def _check_shape(cfg) -> None:
    """What Kubernetes itself would refuse at `kubectl apply`, said here with the key to change."""
    c = cfg.cluster
    if c.workers > MAX_INDEXES or c.ps > MAX_INDEXES:
        _refuse(f"cluster.workers={c.workers} and cluster.ps={c.ps}: an Indexed Job has at most {MAX_INDEXES:,} pods.")
    if c.backoff_limit > INT32:
        _refuse(f"cluster.backoff_limit={c.backoff_limit} is more than Kubernetes can hold ({INT32:,}).")
    for key in ("cpu", "memory"):
        if c[key] is not None and not QUANTITY.fullmatch(str(c[key])):
            _refuse(
                f"cluster.{key}={c[key]!r} is not a Kubernetes quantity: use e.g. cluster.cpu=4 or 3500m, "
                "cluster.memory=8Gi or 512Mi."
            )
    if re.search(r"\s", str(c.image)):
        _refuse(f"cluster.image={c.image!r} has a space in it: give an image reference, e.g. registry.example/runner:1.")


def _gpus(cfg) -> int:
    gpus = cfg.devices.gpus
    if gpus is None:
        return 0
    wanted = sorted(int(g) for g in gpus)
    if len(set(wanted)) != len(wanted):
        _refuse(f"devices.gpus={list(gpus)} names a GPU twice: list each GPU once, e.g. devices.gpus=[0,1].")
    if wanted != list(range(len(wanted))):
        _refuse(
            f"devices.gpus={list(gpus)}: a pod is given nvidia.com/gpu: N GPUs, numbered 0..N-1 inside it, so it cannot "
            f"be asked for these indices. Use devices.gpus=[{','.join(str(i) for i in range(len(wanted)))}] for "
            f"{len(wanted)} GPU(s) per pod."
        )
    return len(wanted)


def _resources(cfg, trains: bool) -> dict:
    """Each pod's requests and limits; GPUs only for the pods that train (workers: not the chief that coordinates
    a parameter_server job, nor its parameter servers)."""
    amounts = {"cpu": cfg.cluster.cpu, "memory": cfg.cluster.memory}
    amounts = {k: str(v) for k, v in amounts.items() if v is not None}
    if _gpus(cfg) and trains:
        amounts["nvidia.com/gpu"] = _gpus(cfg)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")  # MLflow's own


def secret_keys(uri: str | None, environ) -> list[tuple[str, str]]:
    """(variable, key) of what the pods read from the Secret <job>-mlflow: a tracking URI holding a password, and
    MLflow's credential variables set where the manifests are made."""
    keys = [("MLFLOW_TRACKING_URI", "uri")] if uri and redact_uri(uri) != uri else []
    return keys + [(var, var.removeprefix("MLFLOW_TRACKING_").lower()) for var in CREDENTIALS if environ.get(var)]


def _env(uri: str | None, name: str, jobset: bool, secret: list[tuple[str, str]]) -> list[dict]:
    env = [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": f"{name}-mlflow", "key": key}}} for var, key in secret
    ]  # credentials: from a Secret, never in the manifest
    if uri and ("MLFLOW_TRACKING_URI", "uri") not in secret:
        env.append({"name": "MLFLOW_TRACKING_URI", "value": uri})
    if jobset:  # JobSet writes these on the pod as annotations; the runner reads them from the environment
        for var, key in (
            ("JOBSET_NAME", "jobset-name"),
            ("REPLICATED_JOB_NAME", "replicatedjob-name"),
            ("JOB_INDEX", "job-index"),
        ):
            field = f"metadata.annotations['jobset.sigs.k8s.io/{key}']"
            env.append({"name": var, "valueFrom": {"fieldRef": {"fieldPath": field}}})
    env.append({"name": "PYTHONUNBUFFERED", "value": "1"})  # kubectl logs line by line
    return env


def pod_args(cfg, overrides: list[str], name: str, jobset: bool) -> list[str]:
    """The runner's arguments in every pod: the user's overrides, then what the pods need (cluster=kubernetes and
    its shape, the run's directory on the shared volume, one per pod, and the checkpoints there, shared)."""
    kept = [
        o
        for o in overrides
        if o.lstrip("+~").partition("=")[0] not in SET_HERE
        and o.lstrip("+~").partition("=")[0].removeprefix("cluster.") not in MANIFEST_ONLY
        and not re.match(r"cluster\.(workers|ps|port|job_name|service|exit_with_chief)=", o.lstrip("+~"))
    ]
    c = cfg.cluster
    given = _given(overrides, "hydra.run.dir")
    root = given.rstrip("/") if given else f"{c.mount_path.rstrip('/')}/{name}"
    task = "${oc.env:REPLICATED_JOB_NAME}" if jobset else "worker"
    shape = [f"cluster.workers={c.workers}", f"cluster.ps={c.ps}", f"cluster.port={c.port}", f"cluster.job_name={name}"]
    shape += [f"cluster.service={c.service}"] if c.service else []
    shape += ["cluster.exit_with_chief=true"] if jobset else []
    checkpoints = _given(overrides, "checkpoint.dir") or f"{root}/checkpoints"  # yours (gs://...), else on the volume
    return [
        *kept,
        f"strategy={cfg.strategy.name}",  # as composed: an experiment file may have set it
        "cluster=kubernetes",
        *shape,
        f"hydra.run.dir={root}/{task}-${{oc.env:JOB_COMPLETION_INDEX}}",
        f"checkpoint.dir={checkpoints}",
    ]


def _given(overrides: list[str], key: str) -> str | None:
    values = [o.partition("=")[2] for o in overrides if o.lstrip("+").partition("=")[0] == key]
    return values[-1] if values else None


def _container(cfg, args: list[str], env: list[dict], trains: bool = True) -> dict:
    container = {
        "name": "runner",
        "image": cfg.cluster.image,
        "command": ["python", "-m", "runner"],
        "args": args,
        "env": env,
        "ports": [{"name": "grpc", "containerPort": int(cfg.cluster.port)}],
        "volumeMounts": [{"name": "runs", "mountPath": cfg.cluster.mount_path}],
    }
    resources = _resources(cfg, trains)
    if resources:
        container["resources"] = resources
    return container


def _pod(cfg, container: dict, name: str, subdomain: str | None) -> dict:
    volume = (
        {"name": "runs", "persistentVolumeClaim": {"claimName": cfg.cluster.volume}}
        if cfg.cluster.volume
        else {"name": "runs", "emptyDir": {}}
    )
    spec = {"restartPolicy": "Never", "containers": [container], "volumes": [volume]}
    # SIGTERM (a deletion, a preemption) checkpoints at the next step: time for it before Kubernetes kills the pod
    spec["terminationGracePeriodSeconds"] = int(cfg.cluster.stop_grace_sec) + GRACE_SEC
    if subdomain:
        spec["subdomain"] = subdomain
    return {"metadata": {"labels": {LABEL: name}}, "spec": spec}


def _failure_policy() -> dict:
    return {
        "rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "runner", "operator": "In", "values": FATAL_EXITS}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},  # preempted or evicted
        ]
    }


def _meta(cfg, name: str) -> dict:
    meta = {"name": name, "labels": {LABEL: name}}
    if cfg.cluster.namespace:
        meta["namespace"] = cfg.cluster.namespace
    return meta


def manifests(cfg, overrides: list[str], uri: str | None, secret=()) -> list[dict]:
    """The Kubernetes objects for `cfg` (a composed runner config with cluster=kubernetes), in apply order."""
    c = cfg.cluster
    if not c.image:
        _refuse(
            "cluster.image is not set: the pods need a container image with this project installed (pip install .). "
            "Pass cluster.image=<registry>/<image>:<tag>."
        )
    strategy = cfg.strategy.name
    jobset = strategy == "parameter_server"
    if jobset and c.elastic.enabled:
        _refuse(
            "cluster.elastic.enabled=true with strategy=parameter_server: on Kubernetes the pods' agents restart "
            "multi_worker_mirrored workers only. Use strategy=multi_worker_mirrored, or cluster.elastic.enabled=false "
            "(a parameter_server job keeps training through a lost worker by itself)."
        )
    if jobset and c.ps < 1:
        _refuse("strategy=parameter_server needs parameter servers: pass cluster.ps=1 or more.")
    if not jobset and c.ps:
        _refuse(f"cluster.ps={c.ps} is for strategy=parameter_server; strategy={strategy} has workers only: drop cluster.ps.")
    if c.elastic.enabled and not c.volume and not _given(overrides, "checkpoint.dir"):
        _refuse(
            "cluster.elastic.enabled=true restores every generation from checkpoints all pods read, and without "
            "cluster.volume each pod has only its own emptyDir. Give cluster.volume=<a ReadWriteMany "
            "PersistentVolumeClaim>, or a checkpoint.dir every pod reaches (gs://..., s3://...)."
        )
    if str(_given(overrides, "hydra.mode")).endswith("MULTIRUN"):
        _refuse("hydra.mode=MULTIRUN: every pod would run the whole sweep. Generate one job's manifests at a time.")
    _check_shape(cfg)
    name = _name(cfg)
    args = pod_args(cfg, overrides, name, jobset)
    container = _container(cfg, args, _env(uri, name, jobset, list(secret)))
    if not jobset:
        service = c.service or name
        return [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": _meta(cfg, service),
                "spec": {
                    "clusterIP": "None",  # headless: one DNS name per pod, <pod host name>.<service>
                    "publishNotReadyAddresses": True,  # the workers find each other while they start
                    "selector": {LABEL: name},
                    "ports": [{"name": "grpc", "port": int(c.port)}],
                },
            },
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": _meta(cfg, name),
                "spec": {
                    "completionMode": "Indexed",  # pod host names <name>-<index>, JOB_COMPLETION_INDEX
                    "completions": int(c.workers),
                    "parallelism": int(c.workers),
                    # each pod is replaced this many times (a lost peer fails every worker once)
                    "backoffLimitPerIndex": int(c.backoff_limit),
                    "podFailurePolicy": _failure_policy(),
                    "template": _pod(cfg, container, name, service),
                },
            },
        ]
    counts = {"chief": 1, "worker": int(c.workers), "ps": int(c.ps)}
    # A lost worker is replaced by its Job (the coordinator goes on without it meanwhile); a lost chief or ps fails
    # its Job, and the JobSet restarts every pod from the last checkpoint.
    retries = {"worker": {"backoffLimitPerIndex": int(c.backoff_limit)}, "chief": {"backoffLimit": 0}, "ps": {"backoffLimit": 0}}
    replicated = [
        {
            "name": kind,
            "replicas": 1,
            "template": {
                "spec": {
                    "completionMode": "Indexed",
                    "completions": n,
                    "parallelism": n,
                    **retries[kind],
                    "podFailurePolicy": _failure_policy(),
                    "template": _pod(cfg, _container(cfg, args, container["env"], trains=kind == "worker"), name, None),
                }
            },
        }
        for kind, n in counts.items()
    ]
    subdomain = {"subdomain": c.service} if c.service else {}
    return [
        {
            "apiVersion": JOBSET_API,
            "kind": "JobSet",
            "metadata": _meta(cfg, name),
            "spec": {
                # host names <name>-<type>-0-<index>.<subdomain>; the JobSet makes the headless Service
                "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True, **subdomain},
                "replicatedJobs": replicated,
                "successPolicy": {"operator": "Any", "targetReplicatedJobs": ["chief"]},  # done when the chief is
                "failurePolicy": {
                    "maxRestarts": int(c.backoff_limit),  # the JobSet's restarts in all
                    "restartStrategy": "BlockingRecreate",  # the old pods gone before new ones start: no stale ps
                    "rules": [{"name": "fatal-exit", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}],
                },
            },
        }
    ]


def _compose(overrides: list[str]):
    """The pods' config: strategy=auto becomes what it chooses for pods of one worker each."""
    from runner.config.validate import whole

    cfg = composed([*overrides, "cluster=kubernetes"], check=False)  # strategy=auto is refused as such: chosen first
    whole(cfg)  # `~strategy`: named as such before it is read
    if cfg.strategy.name == "auto":
        return composed([*overrides, "cluster=kubernetes", "strategy=multi_worker_mirrored"])
    return checked(cfg)


def main(argv=None) -> int:
    import yaml

    parser = argparse.ArgumentParser(prog="python -m runner.kubernetes", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="the experiment's overrides, as for python -m runner")
    parser.add_argument("--out", help="write the manifests to this file (default: print them)")
    args = parser.parse_args(argv)
    given = [o for o in args.overrides if not o.lstrip("+").startswith("cluster=")]
    try:
        cfg = _compose(given)
        import os

        uri = cfg.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri and cfg.mlflow.enabled:  # the default ./mlflow.db: on the shared volume, written by the chief alone
            uri = f"sqlite:///{cfg.cluster.mount_path.rstrip('/')}/{_name(cfg)}/mlflow.db"
        secret = secret_keys(uri, os.environ)
        objects = manifests(cfg, given, uri, secret)
    except Exception as err:
        code = reported(err, given)  # a config that cannot work: one paragraph
        if code is None:
            raise
        return code
    notes = []
    if secret:
        namespace = f" -n {cfg.cluster.namespace}" if cfg.cluster.namespace else ""
        literals = " ".join(f'--from-literal={key}="${var}"' for var, key in secret)
        notes.append(f"first: kubectl create secret generic {_name(cfg)}-mlflow{namespace} {literals}")
    if not cfg.cluster.volume:
        notes.append("no cluster.volume: checkpoints and outputs live and die with each pod (emptyDir)")
        if uri and uri.startswith("sqlite:"):
            notes.append("MLflow's store is in the chief pod's emptyDir: set mlflow.tracking_uri to a server to keep runs")
    header = "".join(f"# {n}\n" for n in notes)

    class Plain(yaml.SafeDumper):  # the same list in every replicated job is written out each time, not aliased
        def ignore_aliases(self, data):
            return True

    text = header + yaml.dump_all(objects, Dumper=Plain, sort_keys=False, default_flow_style=False)
    if not args.out:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.out, "w") as f:
            f.write(text)
    except OSError as err:
        print(f"Error: --out {args.out}: {err.strerror or err}. Choose a file in a directory you can write.", file=sys.stderr)
        return 2
    kinds = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in objects)
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {kinds} to {args.out}; start it with: kubectl apply -f {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
