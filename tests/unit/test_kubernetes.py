"""cluster=kubernetes and `python -m runner.kubernetes`: the manifests validate against Kubernetes' own OpenAPI schemas
(kubernetes-validate holds them offline, strict: an unknown field fails) and the JobSet CRD's schema
(helpers.validate_manifest); each pod's TF_CONFIG, derived from the environment Kubernetes gives it, is the one TFJob's
operator wrote; bad input is one paragraph, exit 2."""

import json

import pytest
import yaml

from runner import kubernetes
from runner.config import kubernetes_pod
from runner.errors import ConfigError

from helpers import validate_manifest as validate

IMAGE = ["cluster.image=registry.example/runner:1"]
MWMS = [*IMAGE, "strategy=multi_worker_mirrored", "cluster.workers=3", "cluster.volume=runs", "train.epochs=2"]
PS = [*IMAGE, "strategy=parameter_server", "cluster.workers=2", "cluster.ps=1", "cluster.volume=runs", "cluster.cpu=2"]


def generated(args, capsys) -> tuple[int, list, str]:
    code = kubernetes.main(args)
    out, err = capsys.readouterr()
    return code, [d for d in yaml.safe_load_all(out) if d] if code == 0 else [], err


@pytest.mark.parametrize("args", [MWMS, PS, [*IMAGE, "devices.gpus=[0,1]", "cluster.memory=8Gi", "cluster.namespace=ml"]])
def test_the_manifests_validate_against_kubernetes_schemas(args, capsys):
    code, documents, err = generated(args, capsys)
    assert code == 0, err
    assert [d["kind"] for d in documents] == (["JobSet"] if "strategy=parameter_server" in args else ["Service", "Job"])
    for document in documents:
        validate(document)


def test_a_field_kubernetes_does_not_know_fails_the_validation(capsys):
    """The validation can fail: a misspelt field in the Job and in the JobSet is refused."""
    import jsonschema
    import kubernetes_validate

    _, (_, job), _ = generated(MWMS, capsys)
    job["spec"]["completionsMode"] = "Indexed"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job)
    _, (jobset,), _ = generated(PS, capsys)
    jobset["spec"]["successPolicy"]["operators"] = "Any"
    with pytest.raises(jsonschema.ValidationError):
        validate(jobset)


def _pod_env(document, kind="worker", index=0) -> dict:
    """The environment Kubernetes gives pod `index` of `kind`: the Job's completion index, and what the JobSet's
    annotations put in the variables the manifest declares."""
    env = {"JOB_COMPLETION_INDEX": str(index)}
    if document["kind"] == "JobSet":
        env |= {"JOBSET_NAME": document["metadata"]["name"], "REPLICATED_JOB_NAME": kind, "JOB_INDEX": "0"}
    return env


def _args(document) -> list[str]:
    first = document["spec"] if document["kind"] == "Job" else document["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod = first["template"]
    return pod["spec"]["containers"][0]["args"]


def test_every_pod_of_the_indexed_job_derives_the_tf_config_tfjob_wrote(capsys):
    _, (service, job), _ = generated(MWMS, capsys)
    args = _args(job)
    assert "cluster=kubernetes" in args and "cluster.workers=3" in args and "strategy=multi_worker_mirrored" in args
    hosts = [f"tf-runner-{i}.{service['metadata']['name']}:2222" for i in range(3)]
    for i in range(3):
        config = kubernetes_pod.tf_config(*kubernetes_pod.shape_from_command_line(args), environ=_pod_env(job, index=i))
        assert config == {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}}
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]


def test_every_pod_of_the_jobset_derives_chief_workers_and_ps(capsys):
    _, (jobset,), _ = generated(PS, capsys)
    args = _args(jobset)
    assert "cluster.exit_with_chief=true" in args
    spec = {
        "chief": ["tf-runner-chief-0-0.tf-runner:2222"],
        "worker": ["tf-runner-worker-0-0.tf-runner:2222", "tf-runner-worker-0-1.tf-runner:2222"],
        "ps": ["tf-runner-ps-0-0.tf-runner:2222"],
    }
    for kind, hosts in spec.items():
        for i in range(len(hosts)):
            config = kubernetes_pod.tf_config(*kubernetes_pod.shape_from_command_line(args), environ=_pod_env(jobset, kind, i))
            assert config == {"cluster": spec, "task": {"type": kind, "index": i}}
    assert jobset["spec"]["successPolicy"] == {"operator": "Any", "targetReplicatedJobs": ["chief"]}


def test_a_tf_config_already_set_wins_and_a_derived_one_follows_the_config():
    given = {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}
    environ = {"JOB_COMPLETION_INDEX": "1", "TF_CONFIG": json.dumps(given)}
    kubernetes_pod.derive(dict(kubernetes_pod.SHAPE, job_name="j"), "multi_worker_mirrored", environ)
    assert json.loads(environ["TF_CONFIG"])["cluster"]["worker"] == ["a:1", "b:1"]  # a TFJob operator's: kept
    environ = {"JOB_COMPLETION_INDEX": "1"}
    kubernetes_pod.derive(dict(kubernetes_pod.SHAPE, job_name="j"), "multi_worker_mirrored", environ)
    kubernetes_pod.derive(dict(kubernetes_pod.SHAPE, job_name="j", workers=3), "multi_worker_mirrored", environ)
    assert json.loads(environ["TF_CONFIG"])["cluster"]["worker"] == ["j-0.j:2222", "j-1.j:2222", "j-2.j:2222"]


@pytest.mark.parametrize(
    "environ,shape,strategy,says",
    [
        ({}, {}, "multi_worker_mirrored", "JOB_COMPLETION_INDEX is not set"),
        ({"JOB_COMPLETION_INDEX": "3"}, {"workers": 2}, "multi_worker_mirrored", "cluster.workers=2 makes 2 of them"),
        ({"JOB_COMPLETION_INDEX": "0"}, {"ps": 1}, "parameter_server", "this pod is one of an Indexed Job"),
        (
            {"JOB_COMPLETION_INDEX": "0", "JOBSET_NAME": "j", "REPLICATED_JOB_NAME": "learner"},
            {},
            "multi_worker_mirrored",
            "REPLICATED_JOB_NAME is 'learner'",
        ),
    ],
)
def test_a_pod_that_does_not_fit_is_one_paragraph(environ, shape, strategy, says):
    with pytest.raises(ConfigError, match=says):
        kubernetes_pod.tf_config(dict(kubernetes_pod.SHAPE, job_name="j", **shape), strategy, environ)


@pytest.mark.parametrize(
    "args,says",
    [
        (["cluster.workers=2"], "cluster.image is not set"),
        ([*PS, "cluster.elastic.enabled=true"], "on Kubernetes the pods' agents restart multi_worker_mirrored workers"),
        ([*IMAGE, "devices.gpus=[1,3]"], "devices.gpus=[1, 3]: a pod is given nvidia.com/gpu"),
        ([*IMAGE, "cluster.job_name=My_Job"], "cluster.job_name='My_Job' cannot name a Kubernetes job or Service"),
        ([*IMAGE, "cluster.job_name=9job"], "starting with a letter"),
        ([*IMAGE, "cluster.service=Bad_Svc"], "cluster.service='Bad_Svc' cannot name"),
        ([*IMAGE, f"cluster.job_name={'j' * 60}"], "is too long for the pods' host names"),
        ([*IMAGE, "cluster.cpu=lots"], "cluster.cpu='lots' is not a Kubernetes quantity"),
        ([*IMAGE, "cluster.memory=8GB"], "cluster.memory='8GB' is not a Kubernetes quantity"),
        ([*IMAGE, "cluster.workers=1000000"], "an Indexed Job has at most 100,000 pods"),
        ([*IMAGE, "devices.gpus=[0,0]"], "names a GPU twice"),
        (["cluster.image=bad image"], "has a space in it"),
        ([*IMAGE, "cluster.workers=2", "cluster.elastic.enabled=true"], "without cluster.volume each pod has only"),
        ([*IMAGE, "hydra.mode=MULTIRUN"], "every pod would run the whole sweep"),
        ([*IMAGE, "strategy=parameter_server"], "strategy=parameter_server needs parameter servers"),
        ([*IMAGE, "strategy=mirrored"], "strategy=mirrored"),
    ],
)
def test_what_the_manifests_cannot_express_is_refused(args, says, capsys):
    code, _, err = generated(args, capsys)
    assert code == 2 and err.count("Error: ") == 1 and says in err, err
    assert "Traceback" not in err


def test_credentials_come_from_a_secret_never_the_manifest(capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok3n")
    code, (_, job), _ = generated([*MWMS, "mlflow.tracking_uri=http://user:pw@mlflow:5000", "cluster.namespace=ml"], capsys)
    text = json.dumps(job)
    assert code == 0 and "pw@" not in text and "tok3n" not in text
    secret = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
        if "valueFrom" in e
    }
    assert secret == {
        v: {"name": "tf-runner-mlflow", "key": k} for v, k in [("MLFLOW_TRACKING_URI", "uri"), ("MLFLOW_TRACKING_TOKEN", "token")]
    }
    kubernetes.main([*MWMS, "mlflow.tracking_uri=http://user:pw@mlflow:5000", "cluster.namespace=ml", "--out", "/dev/null"])
    said = capsys.readouterr().out
    assert 'kubectl create secret generic tf-runner-mlflow -n ml --from-literal=uri="$MLFLOW_TRACKING_URI"' in said, said
    assert "pw@" not in said and "tok3n" not in said


def test_the_strategy_an_experiment_file_sets_is_in_the_pods_command_and_gpus_only_train(capsys):
    """strategy from the composed config (not only the command line); GPUs only on the pods that train."""
    code, (jobset,), err = generated([*PS, "devices.gpus=[0,1]"], capsys)
    assert code == 0, err
    for job in jobset["spec"]["replicatedJobs"]:
        container = job["template"]["spec"]["template"]["spec"]["containers"][0]
        assert "strategy=parameter_server" in container["args"]
        assert ("nvidia.com/gpu" in container["resources"]["limits"]) == (job["name"] == "worker"), job["name"]
    code, (_, job), _ = generated([*IMAGE, "checkpoint.dir=gs://bucket/exp1", "hydra.run.dir=/data/exp1"], capsys)
    args = _args(job)
    assert "checkpoint.dir=gs://bucket/exp1" in args and "hydra.run.dir=/data/exp1/worker-${oc.env:JOB_COMPLETION_INDEX}" in args
