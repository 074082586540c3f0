"""The pure builders: golden files, and the shape rules of every child."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kubetune_api.rules import TRAINING_OPERATOR_ENV
from kubetune_api.spec import EnvVar, FineTuneJob
from kubetune_api.trainer_config import CONFIG_PATH, TrainerConfig, load_manifest
from kubetune_cli.render import dump_yaml
from kubetune_operator import builders
from kubetune_operator.settings import Settings

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
UID = "0b9f2a9e-5c61-4f8e-9a55-6d2f3b1c7e10"
SETTINGS = Settings(
    trainer_image="registry.example.com/kubetune/trainer:1.2.3",
    default_tracking_uri="http://mlflow.mlflow.svc:5000",
)


def example(name: str, **changes: Any) -> FineTuneJob:
    job = load_manifest(REPO / "examples" / name)
    job.metadata.namespace = "ml"
    job.metadata.uid = UID
    for dotted, value in changes.items():
        target: Any = job
        *path, last = dotted.split("__")
        for part in path:
            target = getattr(target, part)
        setattr(target, last, value)
    return job


def finetune_examples() -> list[Path]:
    # The examples the operator's done-when names; a new example earns its golden file on purpose.
    return [
        REPO / "examples" / n
        for n in ("qwen2-0.5b-lora-8gpu.yaml", "qwen3-4b-full.yaml", "multinode-lora.yaml")
    ]


@pytest.mark.parametrize("path", finetune_examples(), ids=lambda p: p.stem)
def test_golden(path: Path) -> None:
    """Every manifest the operator creates for each example, byte for byte.

    Regenerate after an intended change: KUBETUNE_UPDATE_GOLDEN=1 pytest tests/unit/test_builders.py
    """
    job = example(path.name)
    rendered = dump_yaml(builders.build_children(job, SETTINGS))
    golden = GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("KUBETUNE_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(rendered)
    assert golden.exists(), f"{golden} is missing: run with KUBETUNE_UPDATE_GOLDEN=1"
    assert rendered == golden.read_text()


def _master(ptj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = ptj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    return spec


def test_eight_gpus_one_master() -> None:
    ptj = builders.build_pytorchjob(example("qwen2-0.5b-lora-8gpu.yaml"), SETTINGS)
    assert ptj["apiVersion"] == "kubeflow.org/v1"
    assert set(ptj["spec"]["pytorchReplicaSpecs"]) == {"Master"}
    assert ptj["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] == 1
    assert ptj["spec"]["nprocPerNode"] == "8"
    container = _master(ptj)["containers"][0]
    assert container["name"] == "pytorch"
    assert container["image"] == SETTINGS.trainer_image
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["command"] == [
        "python",
        "-m",
        "kubetune_trainer.launch",  # torchrun that exits 143 (retryable) when preempted
        "--shutdown-grace-s",  # the launcher's own option, read there (never from the environment)
        "540",  # inside terminationGracePeriodSeconds (600)
        "--module",
        "kubetune_trainer.train",
        "--config",
        CONFIG_PATH,
    ]
    from kubetune_trainer.training import launch

    assert launch.split_args(container["command"][3:])[0] == 540  # where the launcher reads it
    assert "KUBETUNE_SHUTDOWN_GRACE_S" not in {e["name"] for e in container["env"]}
    assert _master(ptj)["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_one_gpu() -> None:
    ptj = builders.build_pytorchjob(example("qwen3-4b-full.yaml"), SETTINGS)
    assert set(ptj["spec"]["pytorchReplicaSpecs"]) == {"Master"}
    assert ptj["spec"]["nprocPerNode"] == "1"
    assert _master(ptj)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_two_nodes_master_plus_one_worker() -> None:
    ptj = builders.build_pytorchjob(example("multinode-lora.yaml"), SETTINGS)
    replicas = ptj["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Master": 1, "Worker": 1}
    assert replicas["Master"]["template"] == replicas["Worker"]["template"]
    assert ptj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-training"
    spec = replicas["Worker"]["template"]["spec"]
    assert spec["priorityClassName"] == "training-preemptible"
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_cpu_only_has_no_gpu() -> None:
    job = example("qwen3-4b-full.yaml", spec__resources__gpus_per_node=0, spec__resources__gpu_product=None)
    ptj = builders.build_pytorchjob(job, SETTINGS)
    assert ptj["spec"]["nprocPerNode"] == "1"
    assert "nvidia.com/gpu" not in json.dumps(ptj)


def test_restart_policy_and_backoff_on_purpose() -> None:
    ptj = builders.build_pytorchjob(example("multinode-lora.yaml"), SETTINGS)
    for replica in ptj["spec"]["pytorchReplicaSpecs"].values():
        assert replica["restartPolicy"] == "ExitCode"  # 143 (preempted) restarts, 1 (bad config) does not
    assert ptj["spec"]["runPolicy"] == {"backoffLimit": 6, "cleanPodPolicy": "Running", "suspend": False}
    assert _master(ptj)["terminationGracePeriodSeconds"] == 600


def test_finished_alias_jobs_are_left_to_kubernetes_to_delete() -> None:
    """Each alias change runs a Job: finished ones go after the TTL; the registration Job stays."""
    job = example("qwen2-0.5b-lora-8gpu.yaml")
    settings = Settings.from_env({"KUBETUNE_ALIAS_JOB_TTL_SECONDS": "3600"})
    assert builders.build_alias_job(job, settings)["spec"]["ttlSecondsAfterFinished"] == 3600
    assert builders.build_alias_job(job, SETTINGS)["spec"]["ttlSecondsAfterFinished"] == 86400
    assert "ttlSecondsAfterFinished" not in builders.build_registration_job(job, SETTINGS)["spec"]


def test_mounts_and_writable_caches() -> None:
    ptj = builders.build_pytorchjob(example("qwen2-0.5b-lora-8gpu.yaml"), SETTINGS)
    spec = _master(ptj)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "qwen2-lora-assistant-ckpt"}
    assert volumes["config"]["configMap"] == {"name": "qwen2-lora-assistant-config"}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert mounts == {
        "checkpoints": "/var/lib/kubetune",
        "config": "/etc/kubetune",
        "cache": "/var/cache/kubetune",
        "tmp": "/tmp",
        "dshm": "/dev/shm",
    }
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["HF_HOME"]["value"].startswith("/var/cache/kubetune/")
    # compiled kernels outlive a preempted attempt: they are kept on the checkpoint volume
    assert env["TRITON_CACHE_DIR"]["value"] == "/var/lib/kubetune/.cache/triton"
    assert env["TORCHINDUCTOR_CACHE_DIR"]["value"] == "/var/lib/kubetune/.cache/torchinductor"
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_secrets_only_by_reference() -> None:
    ptj = builders.build_pytorchjob(example("multinode-lora.yaml"), SETTINGS)
    env = {e["name"]: e for e in _master(ptj)["containers"][0]["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
    }
    assert env["MLFLOW_TRACKING_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "mlflow-credentials",
        "key": "token",
    }
    assert env["NCCL_DEBUG"] == {"name": "NCCL_DEBUG", "value": "WARN"}
    for name, var in env.items():
        if any(s in name for s in ("TOKEN", "PASSWORD", "SECRET", "KEY")):
            assert "value" not in var, name
    config = builders.build_config_map(example("multinode-lora.yaml"), SETTINGS)
    assert "hf-token" in config["data"]["config.yaml"]  # the reference, never a value


def test_config_map_is_the_trainer_config() -> None:
    job = example("qwen3-4b-full.yaml")
    cm = builders.build_config_map(job, SETTINGS)
    config = TrainerConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
    assert config.job.name == "qwen3-4b-assistant"
    assert config.job.uid == UID
    assert config.tracking_uri == "http://mlflow.mlflow.svc:5000"
    assert config.registered_model_name == "qwen3_4b_assistant"
    assert config.report_progress is True
    assert config.spec == job.spec


def test_registry_uri_from_spec_or_settings() -> None:
    """spec.registration.registryUri wins over the operator's default; neither: none in the config
    (MLflow's own: the tracking server's registry), and the config hash of such a job is unchanged."""
    job = example("qwen3-4b-full.yaml")
    with_default = Settings(
        trainer_image=SETTINGS.trainer_image,
        default_tracking_uri=SETTINGS.default_tracking_uri,
        default_registry_uri="databricks-uc",
    )

    def config(j: FineTuneJob, settings: Settings) -> TrainerConfig:
        cm = builders.build_config_map(j, settings)
        return TrainerConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))

    assert config(job, SETTINGS).registry_uri is None
    assert "registryUri" not in builders.build_config_map(job, SETTINGS)["data"]["config.yaml"]
    assert config(job, with_default).registry_uri == "databricks-uc"
    assert config(job, with_default).tracking_uri == "http://mlflow.mlflow.svc:5000"
    own = example("qwen3-4b-full.yaml", spec__registration__registry_uri="https://registry.example.com")
    assert config(own, with_default).registry_uri == "https://registry.example.com"
    assert builders.config_hash(job, SETTINGS) == builders.config_hash(job, with_default)
    assert builders.config_hash(own, SETTINGS) != builders.config_hash(job, SETTINGS)


def test_owner_references_and_names() -> None:
    job = example("qwen3-4b-full.yaml")
    children = builders.build_children(job, SETTINGS)
    names = {(c["kind"], c["metadata"]["name"]) for c in children}
    assert names == {
        ("ServiceAccount", "qwen3-4b-assistant-trainer"),
        ("Role", "qwen3-4b-assistant-trainer"),
        ("RoleBinding", "qwen3-4b-assistant-trainer"),
        ("PersistentVolumeClaim", "qwen3-4b-assistant-ckpt"),
        ("ConfigMap", "qwen3-4b-assistant-config"),
        ("Job", "qwen3-4b-assistant-prepare"),
        ("PyTorchJob", "qwen3-4b-assistant-train"),
        ("Job", "qwen3-4b-assistant-register"),
    }
    for child in children:
        assert child["metadata"]["namespace"] == "ml"
        assert child["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "kubetune.io/v1alpha1",
                "kind": "FineTuneJob",
                "name": "qwen3-4b-assistant",
                "uid": UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert child["metadata"]["labels"]["kubetune.io/job"] == "qwen3-4b-assistant"
        assert child["metadata"]["labels"]["kubetune.io/job-uid"] == UID


def test_keep_on_delete_pvc_has_no_owner() -> None:
    job = example("qwen3-4b-full.yaml", spec__storage__keep_on_delete=True)
    pvc = builders.build_pvc(job, SETTINGS)
    assert pvc is not None
    assert "ownerReferences" not in pvc["metadata"]
    assert pvc["metadata"]["labels"]["kubetune.io/job-uid"] == UID


def test_existing_claim_creates_no_pvc() -> None:
    job = example("qwen3-4b-full.yaml", spec__storage__existing_claim="team-checkpoints")
    assert builders.build_pvc(job, SETTINGS) is None
    ptj = builders.build_pytorchjob(job, SETTINGS)
    volumes = {v["name"]: v for v in _master(ptj)["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "team-checkpoints"


def test_storage_class_from_spec_or_settings() -> None:
    job = example("qwen3-4b-full.yaml")
    pvc = builders.build_pvc(job, Settings(default_storage_class="fast-ssd"))
    assert pvc is not None and pvc["spec"]["storageClassName"] == "fast-ssd"
    pvc = builders.build_pvc(example("multinode-lora.yaml"), Settings(default_storage_class="fast-ssd"))
    assert pvc is not None and pvc["spec"]["storageClassName"] == "shared-nfs"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    pvc = builders.build_pvc(job, Settings())
    assert pvc is not None and "storageClassName" not in pvc["spec"]


def test_argocd_tracking_labels_are_not_copied() -> None:
    job = example("multinode-lora.yaml")
    job.metadata.labels = {
        "team": "ml-platform",
        "app.kubernetes.io/instance": "finetunes",
        "argocd.argoproj.io/instance": "finetunes",
        "kueue.x-k8s.io/queue-name": "other",
    }
    job.metadata.annotations = {"argocd.argoproj.io/tracking-id": "finetunes:kubetune.io/FineTuneJob:ml/x"}
    text = json.dumps(builders.build_children(job, SETTINGS))
    assert "argocd.argoproj.io" not in text
    assert "app.kubernetes.io/instance" not in text
    assert '"team": "ml-platform"' in text
    # the queue label comes from spec.resources.queueName only, and only on the PyTorchJob
    ptj = builders.build_pytorchjob(job, SETTINGS)
    assert ptj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-training"
    assert "kueue" not in json.dumps(builders.build_registration_job(job, SETTINGS))


def test_suspend() -> None:
    ptj = builders.build_pytorchjob(example("qwen3-4b-full.yaml", spec__suspend=True), SETTINGS)
    assert ptj["spec"]["runPolicy"]["suspend"] is True
    assert ptj["metadata"]["annotations"][builders.ANNOTATION_SUSPENDED_BY_US] == "true"


def test_registration_job() -> None:
    job = builders.build_registration_job(example("qwen2-0.5b-lora-8gpu.yaml"), SETTINGS)
    assert job["apiVersion"] == "batch/v1"
    assert job["spec"]["backoffLimit"] == 2
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["name"] == "register"
    assert container["image"] == SETTINGS.trainer_image
    assert container["command"] == ["python", "-m", "kubetune_trainer.register", "--config", CONFIG_PATH]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "nvidia.com/gpu" not in json.dumps(job)
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert "nodeSelector" not in pod  # no GPU product: it runs anywhere
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "qwen2-lora-assistant-ckpt"


def test_trainer_identity_is_narrow() -> None:
    job = example("qwen3-4b-full.yaml")
    sa, role, binding = builders.build_trainer_identity(job, SETTINGS)
    assert sa["kind"] == "ServiceAccount"
    assert role["rules"] == [
        {
            "apiGroups": ["kubetune.io"],
            "resources": ["finetunejobs/status"],
            "resourceNames": ["qwen3-4b-assistant"],
            "verbs": ["patch"],
        }
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "ml"}
    ]
    assert _master(builders.build_pytorchjob(job, SETTINGS))["serviceAccountName"] == sa["metadata"]["name"]


def test_settings_service_account_replaces_the_per_job_identity() -> None:
    job = example("qwen3-4b-full.yaml")
    settings = Settings(trainer_service_account="kubetune-trainer")
    assert builders.build_trainer_identity(job, settings) == []
    assert _master(builders.build_pytorchjob(job, settings))["serviceAccountName"] == "kubetune-trainer"


def test_image_override() -> None:
    job = example("qwen3-4b-full.yaml", spec__image="my.registry/trainer@sha256:abc")
    assert (
        _master(builders.build_pytorchjob(job, SETTINGS))["containers"][0]["image"]
        == "my.registry/trainer@sha256:abc"
    )


def test_data_volumes_mounted_read_only() -> None:
    job = example("qwen3-4b-full.yaml")
    job.spec.model = job.spec.model.model_validate(
        {"path": "/models/qwen3", "volume": {"claimName": "models", "subPath": "qwen3-4b"}}
    )
    spec = _master(builders.build_pytorchjob(job, SETTINGS))
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in spec[
        "volumes"
    ]
    assert {"name": "model", "mountPath": "/models/qwen3", "readOnly": True, "subPath": "qwen3-4b"} in spec[
        "containers"
    ][0]["volumeMounts"]


def test_builders_are_pure() -> None:
    job = example("multinode-lora.yaml")
    before = copy.deepcopy(job.model_dump())
    first = builders.build_children(job, SETTINGS)
    second = builders.build_children(job, SETTINGS)
    assert first == second
    assert job.model_dump() == before


def test_render_without_uid_has_no_owner_references() -> None:
    job = load_manifest(REPO / "examples" / "qwen3-4b-full.yaml")
    for child in builders.build_children(job, SETTINGS):
        assert "ownerReferences" not in child["metadata"]
        assert "kubetune.io/job-uid" not in child["metadata"]["labels"]


def test_settings_from_env() -> None:
    s = Settings.from_env(
        {
            "KUBETUNE_TRAINER_IMAGE": "x/y:1",
            "KUBETUNE_NAMESPACES": "a, b,,",
            "KUBETUNE_TRAIN_BACKOFF_LIMIT": "3",
            "KUBETUNE_MLFLOW_TRACKING_URI": "http://m:5000",
            "KUBETUNE_MLFLOW_REGISTRY_URI": "databricks-uc",
            "KUBETUNE_STORAGE_CLASS": "",
        }
    )
    assert s.trainer_image == "x/y:1"
    assert s.namespaces == ("a", "b")
    assert s.train_backoff_limit == 3
    assert s.default_tracking_uri == "http://m:5000"
    assert s.default_registry_uri == "databricks-uc"
    assert s.default_storage_class is None
    assert Settings.from_env({}) == Settings()


def test_preparation_settings() -> None:
    s = Settings.from_env({"KUBETUNE_PREPARATION": "false", "KUBETUNE_HF_ENDPOINT": "http://hub.local:8080"})
    assert s.preparation is False and s.hf_endpoint == "http://hub.local:8080"
    with pytest.raises(ValueError, match="KUBETUNE_PREPARATION='maybe'"):
        Settings.from_env({"KUBETUNE_PREPARATION": "maybe"})
    job = example("qwen3-4b-full.yaml")
    kinds = [(m["kind"], m["metadata"]["name"]) for m in builders.build_children(job, s)]
    assert ("Job", "qwen3-4b-assistant-prepare") not in kinds
    train_env = {
        e["name"]: e.get("value") for e in _master(builders.build_pytorchjob(job, s))["containers"][0]["env"]
    }
    assert "HF_HUB_OFFLINE" not in train_env and train_env["HF_ENDPOINT"] == "http://hub.local:8080"


def test_preparation_job() -> None:
    """The preparation Job: CPU only, fails at once on a refusal (exit 2), and the trainer it
    precedes reads the prepared files offline."""
    job = example("qwen3-4b-full.yaml")
    prep = builders.build_preparation_job(job, SETTINGS)
    pod = prep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert "nvidia.com/gpu.product" not in pod.get("nodeSelector", {})
    assert container["command"][:3] == ["python", "-m", "kubetune_trainer.prepare"]
    assert pod["restartPolicy"] == "Never"
    fail_job = prep["spec"]["podFailurePolicy"]["rules"][0]
    assert fail_job["action"] == "FailJob" and fail_job["onExitCodes"]["values"] == [2]
    train_env = {
        e["name"]: e.get("value")
        for e in _master(builders.build_pytorchjob(job, SETTINGS))["containers"][0]["env"]
    }
    assert train_env["HF_HUB_OFFLINE"] == "1"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/kubetune" in mounts  # the checkpoint volume the trainer reads the prepared files from
    names = [e["name"] for e in _master(builders.build_pytorchjob(job, SETTINGS))["containers"][0]["env"]]
    assert names.count("HF_HUB_OFFLINE") == 1 and names.count("HF_DATASETS_OFFLINE") == 1
    # the offline mode is the operator's alone: spec.env may not name it (kubetune_api.pod_env.RESERVED_ENV)
    online = example("qwen3-4b-full.yaml", spec__env=[EnvVar(name="HF_HUB_OFFLINE", value="0")])
    with pytest.raises(ValidationError, match=r"spec\.env\[0\]\.name: .*Hugging Face Hub"):
        builders.build_pytorchjob(online, SETTINGS)


def test_render_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from kubetune_cli.main import main

    assert main(["render", str(REPO / "examples" / "multinode-lora.yaml"), "-n", "team-a"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    assert kinds == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "PersistentVolumeClaim",
        "ConfigMap",
        "Job",
        "PyTorchJob",
        "Job",
    ]
    assert {d["metadata"]["namespace"] for d in docs} == {"team-a"}


def test_the_trainer_learns_its_cpu_request_for_sizing_compile_workers() -> None:
    """KUBETUNE_CPUS comes from the Downward API, so it is the request the pod really got."""
    with_cpu = _master(builders.build_pytorchjob(example("qwen2-0.5b-lora-8gpu.yaml"), SETTINGS))
    env = {e["name"]: e for e in with_cpu["containers"][0]["env"]}
    assert env["KUBETUNE_CPUS"]["valueFrom"]["resourceFieldRef"] == {
        "containerName": with_cpu["containers"][0]["name"],
        "resource": "requests.cpu",
        "divisor": "1",
    }
    assert with_cpu["containers"][0]["resources"]["requests"]["cpu"] == "32"
    # no request: nothing to pass (the trainer shares the node's CPUs among its ranks)
    without = _master(builders.build_pytorchjob(example("qwen3-4b-full.yaml"), SETTINGS))
    assert "KUBETUNE_CPUS" not in {e["name"] for e in without["containers"][0]["env"]}


def test_the_variables_refused_in_spec_env_are_the_ones_the_operator_sets() -> None:
    from kubetune_api.spec import OPERATOR_ENV

    ptj = builders.build_pytorchjob(example("qwen2-0.5b-lora-8gpu.yaml"), SETTINGS)
    names = {e["name"] for e in _master(ptj)["containers"][0]["env"]}
    assert {n for n in names if n.startswith("KUBETUNE_")} == set(OPERATOR_ENV)


def test_training_pods_leave_the_training_operators_own_variables_to_it() -> None:
    """The Training Operator appends PYTHONUNBUFFERED, MASTER_ADDR, WORLD_SIZE... to every
    container, whatever is there: set here too, the pod would define them twice (seen through the
    real Training Operator: the API server warns "hides previous definition")."""
    ptj = builders.build_pytorchjob(example("multinode-lora.yaml"), SETTINGS)
    for replica in ptj["spec"]["pytorchReplicaSpecs"].values():
        names = [e["name"] for e in replica["template"]["spec"]["containers"][0]["env"]]
        assert not set(names) & set(TRAINING_OPERATOR_ENV), names
    registration = builders.build_registration_job(example("multinode-lora.yaml"), SETTINGS)
    env = registration["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "PYTHONUNBUFFERED", "value": "1"} in env  # a plain Job: nobody else sets it
