"""cluster=kubernetes: this pod's TF_CONFIG, derived from what Kubernetes gives a pod, so that every pod of the job
runs the same command. No TensorFlow, no Kubernetes client: the environment and the host name only.

- A pod of an Indexed Job (multi_worker_mirrored, or one worker): `JOB_COMPLETION_INDEX` is its worker index; its
  host name is `<job>-<index>` and the headless Service `cluster.service` (default: the job's name) is its
  subdomain, so worker i is `<job>-<i>.<service>:<port>`.
- A pod of a JobSet (chief, workers and parameter servers): `JOBSET_NAME`, `REPLICATED_JOB_NAME` and `JOB_INDEX`,
  which the manifests `python -m runner.kubernetes` writes take from the pod's annotations, and
  `JOB_COMPLETION_INDEX`; task i of type t is `<jobset>-<t>-0-<i>.<service>:<port>`, the service defaulting to the
  JobSet's name, as JobSet names its pods and subdomain.

The cluster's shape (cluster.workers, cluster.ps, a chief under parameter_server) comes from the config, as the
pods' command line carries it. A TF_CONFIG already set wins (a TFJob operator's, or an elastic agent's for its
trainer): the runner derives one only where none is set, and says which in `DERIVED`.
"""

import json
import os
import re
import socket

from runner.config.command_line import overrides_in
from runner.errors import ConfigError

LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # a Service's (and so a job's) name: an RFC 1035 label
INDEX = re.compile(r"0|[1-9][0-9]{0,5}")
DERIVED = "RUNNER_TF_CONFIG_DERIVED"  # the TF_CONFIG this process derived: one set by anyone else is left alone
TYPES = ("chief", "worker", "ps")
SHAPE = {"workers": 2, "ps": 0, "port": 2222, "job_name": None, "service": None}  # KubernetesClusterConfig's defaults


def wanted(argv) -> bool:
    """Whether the command line chooses cluster=kubernetes."""
    return any(a.lstrip("+") == "cluster=kubernetes" for a in overrides_in(argv))


def shape_from_command_line(argv) -> tuple[dict, str]:
    """(cluster.* shape fields, strategy name) as the command line sets them over the schema's defaults: what the
    pods' generated command carries, read before Hydra composes the config."""
    shape, strategy = dict(SHAPE), "default"
    for arg in overrides_in(argv):
        key, _, value = arg.lstrip("+").partition("=")
        if key == "strategy":
            strategy = value
        field = key.removeprefix("cluster.")
        if key.startswith("cluster.") and field in SHAPE:
            shape[field] = value if field in ("job_name", "service") else _whole(key, value)
    return shape, strategy


def _whole(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{key}={value!r} is not a whole number.") from None


def name_problem(key: str, name: str, longest: str | None = None) -> str | None:
    """Why `name` cannot name a Kubernetes job or Service (None when it can): an RFC 1035 label, and the longest
    pod host name made from it at most 63 characters."""
    if not LABEL.fullmatch(name) or len(name) > 63:
        return (
            f"{key}={name!r} cannot name a Kubernetes job or Service: use lowercase letters, digits and '-', starting "
            "with a letter and ending with a letter or digit, at most 63 characters (e.g. mnist-mwms-1)."
        )
    if longest and len(longest) > 63:
        return (
            f"{key}={name!r} is too long for the pods' host names: {longest!r} has {len(longest)} characters, and "
            "Kubernetes allows 63. Choose a shorter name."
        )
    return None


def tf_config(shape: dict, strategy: str, environ=os.environ, hostname: str | None = None) -> dict:
    """This pod's TF_CONFIG (as a dict) from its environment: ConfigError when the pod is not one of an Indexed Job
    or a JobSet, or its place does not fit the configured shape."""
    workers, ps, port = int(shape["workers"]), int(shape["ps"]), int(shape["port"])
    chief = strategy == "parameter_server"
    index_text = environ.get("JOB_COMPLETION_INDEX")
    if index_text is None or not INDEX.fullmatch(index_text):
        raise ConfigError(
            "cluster=kubernetes derives TF_CONFIG from the pod of an Indexed Job or a JobSet, and JOB_COMPLETION_INDEX "
            f"is {'not set' if index_text is None else repr(index_text)}: this process is not such a pod. Run it from "
            "the manifests `python -m runner.kubernetes <overrides>` prints, or set TF_CONFIG yourself and use "
            "cluster=tf_config."
        )
    index = int(index_text)
    for key in ("job_name", "service"):
        problem = shape.get(key) and name_problem(f"cluster.{key}", str(shape[key]))
        if problem:
            raise ConfigError(problem)
    jobset = environ.get("JOBSET_NAME")
    if jobset:
        kind, prefix = environ.get("REPLICATED_JOB_NAME", ""), jobset
        service = shape.get("service") or jobset
        hosts = {t: f"{jobset}-{t}-0-{{i}}.{service}" for t in TYPES}
    else:
        if chief or ps:
            raise ConfigError(
                f"cluster=kubernetes with strategy={strategy} and cluster.ps={ps} needs a chief and parameter servers, "
                "pods of several kinds, and this pod is one of an Indexed Job (no JOBSET_NAME), whose pods are all "
                "workers. Use the JobSet that `python -m runner.kubernetes` prints for parameter_server."
            )
        kind = "worker"
        host = hostname or socket.gethostname().split(".")[0]
        prefix = shape.get("job_name") or re.sub(rf"-{index}$", "", host)
        service = shape.get("service") or prefix
        hosts = {"worker": f"{prefix}-{{i}}.{service}"}
    counts = {"chief": 1 if chief else 0, "worker": workers, "ps": ps}
    if kind not in TYPES or not counts[kind]:
        expected = ", ".join(t for t in TYPES if counts[t])
        raise ConfigError(
            f"cluster=kubernetes: this pod's REPLICATED_JOB_NAME is {kind!r}, and a job of strategy={strategy} with "
            f"cluster.workers={workers} and cluster.ps={ps} has {expected} pods. Name the JobSet's replicated jobs "
            "after TensorFlow's task types (chief, worker, ps), as `python -m runner.kubernetes` does."
        )
    if index >= counts[kind]:
        given = {"worker": f"cluster.workers={workers} makes", "ps": f"cluster.ps={ps} makes", "chief": "a job has"}[kind]
        raise ConfigError(
            f"cluster=kubernetes: this pod is {kind} {index} (JOB_COMPLETION_INDEX), and {given} {counts[kind]} of "
            f"them (0..{counts[kind] - 1}). Give every pod the job's own shape, as the manifests of "
            "`python -m runner.kubernetes` do."
        )
    cluster = {t: [hosts[t].format(i=i) + f":{port}" for i in range(counts[t])] for t in TYPES if counts[t]}
    return {"cluster": cluster, "task": {"type": kind, "index": index}}


def derive(shape: dict, strategy: str, environ=os.environ) -> None:
    """Set TF_CONFIG for this pod unless someone else set it: a TFJob operator, or an elastic agent for its trainer
    (whose TF_CONFIG differs from the one this process derived)."""
    given = environ.get("TF_CONFIG")
    if given and given != environ.get(DERIVED):
        return
    if int(shape["workers"]) < 1 or int(shape["ps"]) < 0 or not 1 <= int(shape["port"]) <= 65535:
        return  # out of range: the config's checks say so, in their words
    text = json.dumps(tf_config(shape, strategy, environ))
    environ["TF_CONFIG"] = environ[DERIVED] = text


def from_command_line(argv) -> None:
    """Before Hydra (the directory claims read TF_CONFIG): derive it when the command line chooses cluster=kubernetes."""
    if wanted(argv):
        derive(*shape_from_command_line(argv))
