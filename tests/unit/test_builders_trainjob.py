"""The TrainJob child (Kubeflow Trainer v2, issue 31 item 2), built by the same pure builders as the
PyTorchJob, held to the facts of ``../shared/research/trainjob.md`` (Trainer v2.2, JobSet v0.11.1):
the training pods are the PyTorchJob's but for the container's name, the TrainJob always sends
``trainer``, and the failure policy gives the ExitCode restart semantics. The operator creates them
(tests/integration/test_operator_trainjob.py, against Trainer v2.2.0's real CRDs); not yet checked
against Trainer's and JobSet's webhooks (no Trainer v2 controller runs in the tests yet)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from tests.unit.test_builders import SETTINGS, UID, example

from kubetune_operator import builders

EXAMPLES = ("multinode-lora.yaml", "qwen2-0.5b-lora-8gpu.yaml", "qwen3-4b-full.yaml")


def _pod_template(runtime: dict[str, Any]) -> dict[str, Any]:
    (step,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    template: dict[str, Any] = step["template"]["spec"]["template"]
    return template


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_training_pods_are_the_pytorchjobs_but_for_the_container_name(name: str) -> None:
    """Same command, env, volumes, resources, GPU product, node selector, tolerations, priority,
    grace period, identity and pod security as the PyTorchJob's Master."""
    job = example(name)
    master = builders.build_pytorchjob(job, SETTINGS)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    pod = _pod_template(builders.build_training_runtime(job, SETTINGS))
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "node"  # Trainer v2 applies trainer and the torch env to it
    assert "ports" not in container  # the torch runtime adds 29500 itself
    assert pod["spec"]["restartPolicy"] == "Never"  # a pod failure policy needs it

    expected = copy.deepcopy(master)
    (want,) = expected["spec"]["containers"]
    want["name"] = "node"
    del want["ports"]
    for var in want["env"]:  # the Downward API names the container
        ref = (var.get("valueFrom") or {}).get("resourceFieldRef")
        if ref:
            ref["containerName"] = "node"
    expected["spec"]["restartPolicy"] = "Never"
    assert pod == expected
    # no rendezvous variable of the Training Operator's: torchrun reads the PET_* the runtime sets
    names = {v["name"] for v in container["env"]}
    assert not names & {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}
    assert not any(n.startswith("PET_") for n in names)


def test_what_the_pods_get_from_the_multinode_example() -> None:
    pod = _pod_template(builders.build_training_runtime(example("multinode-lora.yaml"), SETTINGS))["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert pod["priorityClassName"] == "training-preemptible"
    assert pod["tolerations"]
    assert pod["terminationGracePeriodSeconds"] == SETTINGS.termination_grace_seconds
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"]
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"]
    assert container["command"] == builders.train_command(SETTINGS)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_the_trainjob() -> None:
    job = example("multinode-lora.yaml", spec__suspend=True)
    tj = builders.build_trainjob(job, SETTINGS)
    assert (tj["apiVersion"], tj["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    meta = tj["metadata"]
    assert meta["name"] == f"{job.metadata.name}-train" == builders.pytorchjob_name(job)
    assert meta["ownerReferences"][0]["uid"] == UID
    assert meta["labels"][builders.KUEUE_QUEUE_LABEL] == "gpu-training"  # Kueue's label on the TrainJob
    assert meta["labels"][builders.LABEL_JOB] == job.metadata.name
    assert meta["annotations"][builders.ANNOTATION_SUSPENDED_BY_US] == "true"
    spec = tj["spec"]
    assert spec["suspend"] is True
    assert spec["runtimeRef"] == {
        "name": meta["name"],
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
    }
    # always sent (without it no PET_* env and no port): 2 nodes of 8 GPUs, one process per GPU
    assert spec["trainer"] == {"numNodes": 2, "numProcPerNode": 8}
    cpu = builders.build_trainjob(
        example("qwen3-4b-full.yaml", spec__resources__gpus_per_node=0, spec__resources__gpu_product=None),
        SETTINGS,
    )
    assert cpu["spec"]["trainer"]["numProcPerNode"] == 1 and cpu["spec"]["suspend"] is False
    assert builders.KUEUE_QUEUE_LABEL not in cpu["metadata"]["labels"]


def test_the_runtime_sets_what_the_jobset_webhook_would_and_the_trainer_step() -> None:
    job = example("multinode-lora.yaml")
    runtime = builders.build_training_runtime(job, SETTINGS)
    assert (runtime["apiVersion"], runtime["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime")
    assert runtime["metadata"]["name"] == builders.trainjob_name(job)
    assert (
        runtime["metadata"]["namespace"] == job.metadata.namespace
    )  # a TrainingRuntime is the TrainJob's namespace's
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 2, "torch": {}}
    jobset = runtime["spec"]["template"]["spec"]
    assert jobset["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert jobset["successPolicy"] == {"operator": "All"}
    (step,) = jobset["replicatedJobs"]
    assert step["name"] == "node" and step["replicas"] == 1
    assert step["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"
    }
    assert step["template"]["spec"]["completionMode"] == "Indexed"


def test_the_failure_policy_restarts_as_the_exit_code_policy_does() -> None:
    """1-127 fail at once (the pod failure policy fails the Job, and the JobSet fails on it); a
    disrupted pod restarts without counting; anything else restarts, counted up to the limit."""
    runtime = builders.build_training_runtime(example("qwen3-4b-full.yaml"), SETTINGS)
    jobset = runtime["spec"]["template"]["spec"]
    job_spec = jobset["replicatedJobs"][0]["template"]["spec"]
    assert job_spec["backoffLimit"] == 0
    exit_rule, disruption = job_spec["podFailurePolicy"]["rules"]
    codes = exit_rule["onExitCodes"]
    assert (exit_rule["action"], codes["containerName"], codes["operator"]) == ("FailJob", "node", "In")
    # the API's limits: sorted, unique, no 0 with In, at most 255 values
    assert (
        codes["values"] == sorted(set(codes["values"])) == list(range(1, 128)) and len(codes["values"]) <= 255
    )
    assert disruption == {
        "action": "FailJob",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    policy = jobset["failurePolicy"]
    # no JobSet limit: the operator's (trainBackoffLimit restarts without progress) applies, as on PyTorchJob
    assert "maxRestarts" not in policy
    deadline, first, second = policy["rules"]
    # JobSet v0.11's webhook refuses any other rule name (a hyphen included)
    assert all(re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", r["name"]) for r in policy["rules"])
    # the Job controller's reason past activeDeadlineSeconds: the JobSet fails, as a PyTorchJob does
    assert deadline == {
        "name": "deadlineExceeded",
        "action": "FailJobSet",
        "onJobFailureReasons": ["DeadlineExceeded"],
    }
    assert first["action"] == "FailJobSet" and first["onJobFailureReasons"] == ["PodFailurePolicy"]
    # the Job controller's message of an exit-code rule: "Container node for pod ns/p failed with exit code 2 ..."
    assert first["onJobFailureMessagePatterns"] == ["failed with exit code"]
    # every other failure restarts: a disruption, a retryable exit code (the Job's backoffLimit exceeded)
    assert second == {"name": "retryable", "action": "RestartJobSetAndIgnoreMaxRestarts"}


def test_the_longest_pod_name_fits() -> None:
    """The JobSet webhook refuses a JobSet whose longest pod name exceeds 63 characters: with the
    longest FineTuneJob name and the most nodes, ``<tj>-node-0-<index>-<5 random>`` fits."""
    from kubetune_api.cel import MAX_NAME_LENGTH

    job = example("qwen3-4b-full.yaml", spec__resources__nodes=512)
    job.metadata.name = "a" * MAX_NAME_LENGTH
    name = builders.trainjob_name(job)
    longest = f"{name}-{builders.TRAINJOB_STEP}-0-{512 - 1}-xxxxx"
    assert len(longest) <= 63 and name[0].isalpha()


def test_render_renders_the_trainjob_child_when_the_spec_names_that_engine(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kubetune render``: spec.engine TrainJob renders the runtime and the TrainJob in place of the
    PyTorchJob; the operator's default engine (KUBETUNE_ENGINE) does the same for a spec naming none."""
    import yaml
    from tests.unit.test_builders import REPO

    from kubetune_cli.main import main

    doc = yaml.safe_load((REPO / "examples" / "multinode-lora.yaml").read_text())
    doc["spec"]["engine"] = "TrainJob"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["render", str(path)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    assert "PyTorchJob" not in kinds
    assert kinds[kinds.index("TrainingRuntime") + 1] == "TrainJob"
    trainjob = docs[kinds.index("TrainJob")]
    assert trainjob["spec"]["runtimeRef"]["name"] == trainjob["metadata"]["name"]

    del doc["spec"]["engine"]
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KUBETUNE_ENGINE", "TrainJob")
    assert main(["render", str(path)]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert "TrainJob" in kinds and "PyTorchJob" not in kinds
    monkeypatch.setenv("KUBETUNE_ENGINE", "auto")  # resolved against the cluster: rendered as the PyTorchJob
    assert main(["render", str(path)]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert "PyTorchJob" in kinds and "TrainJob" not in kinds


def test_the_deadline_is_set_only_where_the_jobset_fails_on_it() -> None:
    """JobSet tries its rules in order and restarts on the first that matches (or on none): the
    deadline goes only on a JobSet whose first rule for a Job past its deadline fails it."""
    runtime = builders.build_training_runtime(example("qwen3-4b-full.yaml"), SETTINGS)
    ours = {"spec": runtime["spec"]["template"]["spec"]}
    assert builders.fails_on_deadline(ours)

    def jobset(*rules: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"failurePolicy": {"rules": list(rules)}}}

    permanent, retryable = ours["spec"]["failurePolicy"]["rules"][1:]
    assert not builders.fails_on_deadline(jobset(permanent, retryable))  # an older kubetune's runtime
    assert not builders.fails_on_deadline({"spec": {}})  # no policy: fails, but kubetune's always has one
    assert not builders.fails_on_deadline(
        jobset(retryable, builders.DEADLINE_RULE)
    )  # the restart comes first
    other_step = {**builders.DEADLINE_RULE, "targetReplicatedJobs": ["dataset-initializer"]}
    assert not builders.fails_on_deadline(jobset(other_step, retryable))
    maybe = {**builders.DEADLINE_RULE, "onJobFailureMessagePatterns": ["never"]}
    assert not builders.fails_on_deadline(jobset(maybe, retryable))
    assert builders.fails_on_deadline(jobset(maybe, builders.DEADLINE_RULE, retryable))
