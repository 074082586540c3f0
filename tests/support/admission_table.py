"""The table of FineTuneJobs the API server must refuse (each naming its field) and of edge values it
must admit, every one derived from examples/qwen3-4b-full.yaml by one change. The same table goes
to the real API server (tests/integration/test_admission_table.py) and to the Python check
(tests/unit/test_rules.py): the verdicts and the field named must agree."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE_FILE = EXAMPLES / "qwen3-4b-full.yaml"
DELETE = object()

Change = dict[str, Any]


@dataclass(frozen=True)
class Case:
    id: str
    change: Change  # dotted path -> new value (DELETE: remove it)
    field: str  # what the refusal must name ("" for an admitted case)

    def manifest(self, name: str | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = copy.deepcopy(yaml.safe_load(BASE_FILE.read_text()))
        if name:
            doc["metadata"]["name"] = name
        for path, value in self.change.items():
            node = doc
            keys = path.split(".")
            for key in keys[:-1]:
                node = node.setdefault(key, {})
            if value is DELETE:
                node.pop(keys[-1], None)
            else:
                node[keys[-1]] = copy.deepcopy(value)
        return doc


def _model_volume(path: str = "/models/qwen", **volume: Any) -> Change:
    return {"spec.model": {"path": path, "volume": {"claimName": "models", **volume}}}


def _data_volume(path: str = "/data/train.jsonl", **volume: Any) -> Change:
    return {
        "spec.dataset": {
            "path": path,
            "volume": {"claimName": "data", **volume},
            "format": "messages",
            "evalFraction": 0.1,
        }
    }


def _layout(layout: str, **fields: Any) -> Change:
    return {"spec.dataset.layout": layout, **{f"spec.dataset.{k}": v for k, v in fields.items()}}


def _example_spec(name: str, document: int = 0) -> Change:
    """The whole spec of examples/<name> (its document-th job) in place of the base's."""
    return {"spec": list(yaml.safe_load_all((EXAMPLES / name).read_text()))[document]["spec"]}


def _prefer(objective: str = "dpo", **fields: Any) -> Change:
    """Preference tuning on the base: pairs found by their columns (format auto)."""
    return {"spec.objective": objective, "spec.dataset.format": "auto", **fields}


def _lora(**fields: Any) -> Change:
    return {"spec.method": "lora", "spec.lora": fields}


def _env(*items: dict[str, Any]) -> Change:
    return {"spec.env": list(items)}


def _resources(**fields: Any) -> Change:
    return {f"spec.resources.{k}": v for k, v in fields.items()}


def _tolerations(*items: dict[str, Any]) -> Change:
    return {"spec.resources.tolerations": list(items)}


SHA = "0123456789abcdef0123456789abcdef01234567"
DIGEST = "sha256:" + "ab" * 32
_C = Case

INVALID: list[Case] = [
    # --- quantities: Kubernetes quantities, above zero ---
    _C("cpu-1.2.3", _resources(cpu="1.2.3"), "spec.resources.cpu"),
    _C("cpu-zero", _resources(cpu="0"), "spec.resources.cpu"),
    _C("cpu-zero-milli", _resources(cpu="0m"), "spec.resources.cpu"),
    _C("cpu-negative", _resources(cpu="-1"), "spec.resources.cpu"),
    _C("cpu-bare-exponent", _resources(cpu="1e"), "spec.resources.cpu"),
    _C("memory-GiGi", _resources(memory="5GiGi"), "spec.resources.memory"),
    _C("memory-zero", _resources(memory="0"), "spec.resources.memory"),
    _C("memory-zero-Gi", _resources(memory="0Gi"), "spec.resources.memory"),
    _C("memory-GB", _resources(memory="16GB"), "spec.resources.memory"),
    _C("shm-zero", _resources(sharedMemory="0"), "spec.resources.sharedMemory"),
    _C("shm-word", _resources(sharedMemory="lots"), "spec.resources.sharedMemory"),
    _C("storage-zero", {"spec.storage.size": "0"}, "spec.storage.size"),
    _C("storage-1.2.3", {"spec.storage.size": "1.2.3"}, "spec.storage.size"),
    _C("storage-space", {"spec.storage.size": "100 Gi"}, "spec.storage.size"),
    _C("storage-zero-exponent", {"spec.storage.size": "0e3"}, "spec.storage.size"),
    # --- volumes ---
    _C("model-subpath-absolute", _model_volume(subPath="/etc"), "spec.model.volume.subPath"),
    _C("model-subpath-climbs", _model_volume(subPath="../other"), "spec.model.volume.subPath"),
    _C("model-subpath-climbs-inside", _model_volume(subPath="a/../../b"), "spec.model.volume.subPath"),
    _C("data-subpath-climbs", _data_volume(subPath="x/.."), "spec.dataset.volume.subPath"),
    _C("model-at-checkpoints", _model_volume("/var/lib/kubetune"), "spec.model.path"),
    _C("model-inside-checkpoints", _model_volume("/var/lib/kubetune/model"), "spec.model.path"),
    _C("model-above-checkpoints", _model_volume("/var/lib"), "spec.model.path"),
    _C("model-at-root", _model_volume("/"), "spec.model.path"),
    _C("data-at-config", _data_volume("/etc/kubetune"), "spec.dataset.path"),
    _C("data-at-tmp", _data_volume("/tmp/train.jsonl"), "spec.dataset.path"),
    _C("data-above-shm", _data_volume("/dev"), "spec.dataset.path"),
    _C("data-at-cache", _data_volume("/var/cache/kubetune/data"), "spec.dataset.path"),
    _C(
        "model-and-data-same-path",
        {**_model_volume("/data"), **_data_volume("/data")},
        "spec.dataset.path",
    ),
    _C(
        "data-inside-model-volume",
        {**_model_volume("/models"), **_data_volume("/models/data")},
        "spec.dataset.path",
    ),
    _C("data-path-climbs", _data_volume("/data/../etc/passwd"), "spec.dataset.path"),
    _C(
        "data-path-dot",
        {"spec.dataset.path": "/data/./x.jsonl", "spec.dataset.name": DELETE},
        "spec.dataset.path",
    ),
    _C("data-path-double-slash", _data_volume("/data//x.jsonl"), "spec.dataset.path"),
    _C("model-path-trailing-slash", _model_volume("/models/qwen/"), "spec.model.path"),
    _C(
        "data-path-relative",
        {"spec.dataset.path": "data/x.jsonl", "spec.dataset.name": DELETE},
        "spec.dataset.path",
    ),
    _C("data-volume-without-path", {"spec.dataset.volume": {"claimName": "data"}}, "spec.dataset.volume"),
    _C("model-volume-without-path", {"spec.model.volume": {"claimName": "models"}}, "spec.model.volume"),
    _C("model-path-relative", {"spec.model": {"path": "models/qwen"}}, "spec.model.path"),
    # --- env ---
    _C(
        "env-duplicate",
        _env({"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_DEBUG", "value": "WARN"}),
        "spec.env[1]",
    ),
    _C("env-ld-preload", _env({"name": "LD_PRELOAD", "value": "/x.so"}), "spec.env[0].name"),
    _C("env-ld-library-path", _env({"name": "LD_LIBRARY_PATH", "value": "/x"}), "spec.env[0].name"),
    _C("env-pythonpath", _env({"name": "PYTHONPATH", "value": "/x"}), "spec.env[0].name"),
    _C("env-pythonstartup", _env({"name": "PYTHONSTARTUP", "value": "/x.py"}), "spec.env[0].name"),
    _C("env-pythonhome", _env({"name": "PYTHONHOME", "value": "/x"}), "spec.env[0].name"),
    _C("env-path", _env({"name": "PATH", "value": "/x"}), "spec.env[0].name"),
    _C("env-bash-env", _env({"name": "BASH_ENV", "value": "/x.sh"}), "spec.env[0].name"),
    _C("env-kubetune-config", _env({"name": "KUBETUNE_CONFIG", "value": "/x.yaml"}), "spec.env[0].name"),
    _C("env-kubetune-cpus", _env({"name": "KUBETUNE_CPUS", "value": "4"}), "spec.env[0].name"),
    _C("env-home", _env({"name": "HOME", "value": "/root"}), "spec.env[0].name"),
    _C("env-tmpdir", _env({"name": "TMPDIR", "value": "/x"}), "spec.env[0].name"),
    _C(
        "env-hf-token-from-secret",
        _env({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}),
        "spec.env[0].name",
    ),
    _C("env-master-addr", _env({"name": "MASTER_ADDR", "value": "10.0.0.1"}), "spec.env[0].name"),
    _C("env-pythonunbuffered", _env({"name": "PYTHONUNBUFFERED", "value": "0"}), "spec.env[0].name"),
    # every class of RESERVED_ENV (kubetune_api.pod_env), as an attacker would try it
    _C("env-register-force", _env({"name": "KUBETUNE_REGISTER_FORCE", "value": "1"}), "spec.env[0].name"),
    _C(
        "env-register-force-lowercase",
        _env({"name": "kubetune_register_force", "value": "1"}),
        "spec.env[0].name",
    ),
    _C(
        "env-register-force-from-secret",
        _env({"name": "KUBETUNE_REGISTER_FORCE", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
        "spec.env[0].name",
    ),
    _C(
        "env-register-force-leading-space",
        _env({"name": " KUBETUNE_REGISTER_FORCE", "value": "1"}),
        "spec.env[0].name",
    ),
    _C(
        "env-register-force-trailing-space",
        _env({"name": "KUBETUNE_REGISTER_FORCE ", "value": "1"}),
        "spec.env[0].name",
    ),
    _C(
        "env-register-force-after-ordinary",
        _env({"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "KUBETUNE_REGISTER_FORCE", "value": "1"}),
        "spec.env[1].name",
    ),
    _C(
        "env-register-force-twice",
        _env(
            {"name": "KUBETUNE_REGISTER_FORCE", "value": ""},
            {"name": "KUBETUNE_REGISTER_FORCE", "value": "1"},
        ),
        "spec.env[1]",
    ),
    _C(
        "env-kubetune-claim-wait",
        _env({"name": "KUBETUNE_REGISTER_CLAIM_WAIT_S", "value": "0"}),
        "spec.env[0].name",
    ),
    _C(
        "env-kubetune-termination-log",
        _env({"name": "KUBETUNE_TERMINATION_LOG", "value": "/x"}),
        "spec.env[0].name",
    ),
    _C("env-kubetune-future", _env({"name": "KUBETUNE_ANYTHING_NEW", "value": "1"}), "spec.env[0].name"),
    _C("env-hub-staging", _env({"name": "HUGGINGFACE_CO_STAGING", "value": "1"}), "spec.env[0].name"),
    _C("env-hf-modules-cache", _env({"name": "HF_MODULES_CACHE", "value": "/x"}), "spec.env[0].name"),
    _C("env-nccl-net-plugin", _env({"name": "NCCL_NET_PLUGIN", "value": "/x.so"}), "spec.env[0].name"),
    _C("env-openssl-conf", _env({"name": "OPENSSL_CONF", "value": "/x.cnf"}), "spec.env[0].name"),
    _C("env-pythonwarnings", _env({"name": "PYTHONWARNINGS", "value": "error::x.Y"}), "spec.env[0].name"),
    _C(
        "env-https-proxy-lowercase",
        _env({"name": "https_proxy", "value": "http://p:3128"}),
        "spec.env[0].name",
    ),
    _C(
        "env-aws-endpoint-url-s3",
        _env({"name": "AWS_ENDPOINT_URL_S3", "value": "http://x"}),
        "spec.env[0].name",
    ),
    _C("env-ssl-cert-file", _env({"name": "SSL_CERT_FILE", "value": "/x.pem"}), "spec.env[0].name"),
    _C("env-kubetune-image-mixed-case", _env({"name": "Kubetune_Image", "value": "x"}), "spec.env[0].name"),
    _C("env-tuning-lowercase", _env({"name": "kubetune_sharding", "value": "ddp"}), "spec.env[0].name"),
    _C(
        "env-hf-endpoint",
        _env({"name": "HF_ENDPOINT", "value": "https://hub.example.com"}),
        "spec.env[0].name",
    ),
    _C("env-hf-hub-offline", _env({"name": "HF_HUB_OFFLINE", "value": "0"}), "spec.env[0].name"),
    _C("env-hf-home", _env({"name": "HF_HOME", "value": "/x"}), "spec.env[0].name"),
    _C(
        "env-hub-token-old-name",
        _env({"name": "HUGGING_FACE_HUB_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
        "spec.env[0].name",
    ),
    _C(
        "env-mlflow-tracking-uri",
        _env({"name": "MLFLOW_TRACKING_URI", "value": "https://m.example.com"}),
        "spec.env[0].name",
    ),
    _C(
        "env-mlflow-registry-uri",
        _env({"name": "MLFLOW_REGISTRY_URI", "value": "https://m.example.com"}),
        "spec.env[0].name",
    ),
    _C("env-mlflow-run-id", _env({"name": "MLFLOW_RUN_ID", "value": "abc"}), "spec.env[0].name"),
    _C(
        "env-mlflow-insecure-tls",
        _env({"name": "MLFLOW_TRACKING_INSECURE_TLS", "value": "true"}),
        "spec.env[0].name",
    ),
    _C("env-rank", _env({"name": "RANK", "value": "0"}), "spec.env[0].name"),
    _C("env-local-rank", _env({"name": "LOCAL_RANK", "value": "0"}), "spec.env[0].name"),
    _C("env-pet-nnodes", _env({"name": "PET_NNODES", "value": "1"}), "spec.env[0].name"),
    _C("env-pet-rdzv", _env({"name": "PET_RDZV_ENDPOINT", "value": "10.0.0.1:29400"}), "spec.env[0].name"),
    _C("env-torchelastic", _env({"name": "TORCHELASTIC_RUN_ID", "value": "x"}), "spec.env[0].name"),
    _C("env-nvidia-visible", _env({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}), "spec.env[0].name"),
    _C("env-cuda-visible", _env({"name": "CUDA_VISIBLE_DEVICES", "value": "0"}), "spec.env[0].name"),
    _C(
        "env-kubernetes-host",
        _env({"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.9"}),
        "spec.env[0].name",
    ),
    _C("env-ld-preload-lowercase", _env({"name": "ld_preload", "value": "/x.so"}), "spec.env[0].name"),
    _C("env-pythonbreakpoint", _env({"name": "PYTHONBREAKPOINT", "value": "os.system"}), "spec.env[0].name"),
    _C("env-xdg-cache", _env({"name": "XDG_CACHE_HOME", "value": "/x"}), "spec.env[0].name"),
    _C(
        "env-uri-password",
        _env({"name": "DATABASE_URL", "value": "postgres://bob:hunter2@db/x"}),
        "spec.env[0].value",
    ),
    _C(
        "env-uri-token-user",
        _env({"name": "GIT_REMOTE", "value": "https://ghp_abc@github.com/o/r"}),
        "spec.env[0].value",
    ),
    _C(
        "env-uri-query-token",
        _env({"name": "DATA_URL", "value": "https://h/x?token=abc"}),
        "spec.env[0].value",
    ),
    _C("env-inline-api-key", _env({"name": "WANDB_API_KEY", "value": "abc"}), "spec.env[0].value"),
    _C("env-sharding-typo", _env({"name": "KUBETUNE_SHARDING", "value": "fsdp"}), "spec.env[0].value"),
    _C("env-fp8-on", _env({"name": "KUBETUNE_FP8", "value": "on"}), "spec.env[0].value"),
    _C(
        "env-workers-many",
        _env({"name": "KUBETUNE_DATALOADER_WORKERS", "value": "many"}),
        "spec.env[0].value",
    ),
    _C("env-bucket-zero", _env({"name": "KUBETUNE_DDP_BUCKET_MB", "value": "0"}), "spec.env[0].value"),
    _C("env-reshard-two", _env({"name": "KUBETUNE_FSDP_RESHARD", "value": "2"}), "spec.env[0].value"),
    _C("env-varlen-flash2", _env({"name": "KUBETUNE_VARLEN_KERNEL", "value": "flash2"}), "spec.env[0].value"),
    _C("env-gpu-memory-half", _env({"name": "KUBETUNE_GPU_MEMORY_GIB", "value": "0.5"}), "spec.env[0].value"),
    _C(
        "env-value-and-from",
        _env({"name": "X", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
        "spec.env[0]",
    ),
    _C("env-neither-value", _env({"name": "X"}), "spec.env[0]"),
    _C("env-name-digit", _env({"name": "1X", "value": "1"}), "spec.env[0].name"),
    _C(
        "tracking-uri-query-token",
        {"spec.registration.trackingUri": "https://mlflow.example.com/?access_token=abc"},
        "spec.registration.trackingUri",
    ),
    _C(
        "tracking-uri-password",
        {"spec.registration.trackingUri": "https://bob:hunter2@mlflow.example.com"},
        "spec.registration.trackingUri",
    ),
    _C(
        "registry-uri-password",
        {"spec.registration.registryUri": "https://bob:hunter2@registry.example.com"},
        "spec.registration.registryUri",
    ),
    _C(
        "registry-uri-query-token",
        {"spec.registration.registryUri": "https://registry.example.com/?token=abc"},
        "spec.registration.registryUri",
    ),
    _C(
        "registry-uri-scheme",
        {"spec.registration.registryUri": "postgresql://db/registry"},
        "spec.registration.registryUri",
    ),
    _C(
        "registry-uri-bare-host",
        {"spec.registration.registryUri": "registry.example.com"},
        "spec.registration.registryUri",
    ),
    # --- credentials by the shape of the value (cel.CREDENTIAL_SHAPES), whatever the field is called ---
    _C("env-hf-token-value", _env({"name": "HUB_READ", "value": "hf_" + "a1B2" * 9}), "spec.env[0].value"),
    _C(
        "env-github-pat", _env({"name": "REPO_PAT", "value": "github_pat_" + "A1_" * 10}), "spec.env[0].value"
    ),
    _C("env-ghp", _env({"name": "GH", "value": "x ghp_" + "a" * 36}), "spec.env[0].value"),
    _C("env-sk-key", _env({"name": "OPENAI", "value": "sk-proj-" + "a1" * 12}), "spec.env[0].value"),
    _C("env-aws-key-id", _env({"name": "AWS_ID", "value": "AKIAIOSFODNN7EXAMPLE"}), "spec.env[0].value"),
    _C("env-slack", _env({"name": "HOOK", "value": "xoxb-123456789012-abcdef"}), "spec.env[0].value"),
    _C("env-gcp-oauth", _env({"name": "GCP", "value": "ya29." + "a0" * 15}), "spec.env[0].value"),
    _C(
        "env-jwt",
        _env({"name": "BEARER", "value": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abc"}),
        "spec.env[0].value",
    ),
    _C(
        "env-azure-sas",
        _env({"name": "DATA", "value": "https://a.blob.core.windows.net/c/d?sv=2022-11-02&sig=abc%3D"}),
        "spec.env[0].value",
    ),
    _C(
        "env-s3-presigned",
        _env({"name": "DATA", "value": "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=x&X-Amz-Signature=ab"}),
        "spec.env[0].value",
    ),
    _C(
        "env-gcs-signed",
        _env({"name": "DATA", "value": "https://storage.googleapis.com/b/o?x-goog-signature=ab"}),
        "spec.env[0].value",
    ),
    _C("model-name-hf-token", {"spec.model.name": "hf_" + "a" * 34}, "spec.model.name"),
    _C("model-revision-ghp", {"spec.model.revision": "ghp_" + "a" * 36}, "spec.model.revision"),
    _C(
        "model-registered-token",
        {"spec.model": {"registered": "models:/sk-" + "a" * 24 + "@champion"}},
        "spec.model.registered",
    ),
    _C("dataset-name-hf-token", {"spec.dataset.name": "org/hf_" + "a" * 34}, "spec.dataset.name"),
    _C("dataset-revision-aws", {"spec.dataset.revision": "AKIAIOSFODNN7EXAMPLE"}, "spec.dataset.revision"),
    _C(
        "tracking-uri-sas",
        {"spec.registration.trackingUri": "https://mlflow.example.com/?sv=1&sig=abc"},
        "spec.registration.trackingUri",
    ),
    _C(
        "registry-uri-sas",
        {"spec.registration.registryUri": "https://registry.example.com/?sv=1&sig=abc"},
        "spec.registration.registryUri",
    ),
    _C(
        "experiment-jwt",
        {"spec.registration.experiment": "eyJ" + "a" * 10 + ".eyJ" + "b" * 10},
        "spec.registration.experiment",
    ),
    _C(
        "model-name-slack",
        {"spec.registration.modelName": "xoxp-1234567890-x"},
        "spec.registration.modelName",
    ),
    _C("image-tag-token", {"spec.image": "registry.example.com/t:ya29." + "a" * 20}, "spec.image"),
    # --- scheduling fields Kubernetes refuses in a pod ---
    _C("node-selector-key-space", _resources(nodeSelector={"bad key": "x"}), "spec.resources.nodeSelector"),
    _C("node-selector-key-dash", _resources(nodeSelector={"-zone": "x"}), "spec.resources.nodeSelector"),
    _C(
        "node-selector-key-two-slashes",
        _resources(nodeSelector={"a/b/c": "x"}),
        "spec.resources.nodeSelector",
    ),
    _C(
        "node-selector-key-upper-prefix",
        _resources(nodeSelector={"Example.com/x": "y"}),
        "spec.resources.nodeSelector",
    ),
    _C("node-selector-key-64", _resources(nodeSelector={"k" * 64: "x"}), "spec.resources.nodeSelector"),
    _C("node-selector-value-space", _resources(nodeSelector={"zone": "a b"}), "spec.resources.nodeSelector"),
    _C("node-selector-value-64", _resources(nodeSelector={"zone": "v" * 64}), "spec.resources.nodeSelector"),
    _C(
        "toleration-exists-with-value",
        _tolerations({"key": "gpu", "operator": "Exists", "value": "yes"}),
        "spec.resources.tolerations[0].value",
    ),
    _C(
        "toleration-seconds-noschedule",
        _tolerations({"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30}),
        "spec.resources.tolerations[0].tolerationSeconds",
    ),
    _C(
        "toleration-seconds-no-effect",
        _tolerations({"key": "gpu", "operator": "Exists", "tolerationSeconds": 30}),
        "spec.resources.tolerations[0].tolerationSeconds",
    ),
    _C(
        "toleration-empty-key-equal",
        _tolerations({"operator": "Equal", "value": "x"}),
        "spec.resources.tolerations[0].operator",
    ),
    _C(
        "toleration-key-space",
        _tolerations({"key": "bad key", "operator": "Exists"}),
        "spec.resources.tolerations[0].key",
    ),
    _C(
        "toleration-value-bang",
        _tolerations({"key": "gpu", "value": "yes!"}),
        "spec.resources.tolerations[0].value",
    ),
    _C(
        "toleration-operator",
        _tolerations({"key": "gpu", "operator": "Sometimes"}),
        "spec.resources.tolerations[0].operator",
    ),
    _C(
        "storage-class-underscore",
        {"spec.storage.storageClassName": "Fast_SSD"},
        "spec.storage.storageClassName",
    ),
    _C(
        "storage-class-double-dot",
        {"spec.storage.storageClassName": "fast..ssd"},
        "spec.storage.storageClassName",
    ),
    _C("priority-class-upper", _resources(priorityClassName="High_Prio"), "spec.resources.priorityClassName"),
    # --- strings that reach other systems ---
    _C("revision-double-dot", {"spec.model.revision": "main..dev"}, "spec.model.revision"),
    _C("revision-lock", {"spec.model.revision": "refs/heads/x.lock"}, "spec.model.revision"),
    _C("revision-space", {"spec.model.revision": "v1 beta"}, "spec.model.revision"),
    _C("revision-tilde", {"spec.model.revision": "main~1"}, "spec.model.revision"),
    _C("revision-leading-slash", {"spec.model.revision": "/main"}, "spec.model.revision"),
    _C("revision-trailing-slash", {"spec.model.revision": "main/"}, "spec.model.revision"),
    _C("revision-at", {"spec.model.revision": "@"}, "spec.model.revision"),
    _C("revision-reflog", {"spec.model.revision": "main@{1}"}, "spec.model.revision"),
    _C("revision-newline", {"spec.model.revision": "main\nx"}, "spec.model.revision"),
    _C("dataset-revision-dot-part", {"spec.dataset.revision": "refs/.hidden"}, "spec.dataset.revision"),
    _C("model-name-newline", {"spec.registration.modelName": "qwen\nadmin"}, "spec.registration.modelName"),
    _C("model-name-tab", {"spec.registration.modelName": "qwen\tx"}, "spec.registration.modelName"),
    _C("model-name-bell", {"spec.registration.modelName": "qwen\x07"}, "spec.registration.modelName"),
    _C("experiment-newline", {"spec.registration.experiment": "team\nx"}, "spec.registration.experiment"),
    _C("split-newline", {"spec.dataset.split": "train\n"}, "spec.dataset.split"),
    _C("image-upper-path", {"spec.image": "registry.example.com/Team/trainer:1"}, "spec.image"),
    _C("image-space", {"spec.image": "trainer image:1"}, "spec.image"),
    _C("image-empty-tag", {"spec.image": "registry.example.com/kubetune/trainer:"}, "spec.image"),
    _C("image-bad-digest", {"spec.image": "registry.example.com/kubetune/trainer@sha256:xyz"}, "spec.image"),
    _C("image-leading-dash", {"spec.image": "-trainer"}, "spec.image"),
    _C("image-two-tags", {"spec.image": "trainer:1:2"}, "spec.image"),
    _C("alias-latest", {"spec.registration.alias": "latest"}, "spec.registration.alias"),
    # --- names that reach MLflow: as strict as MLflow, and no character that hides or reorders ---
    _C("alias-latest-upper", {"spec.registration.alias": "LATEST"}, "spec.registration.alias"),
    _C("alias-version-upper", {"spec.registration.alias": "V3"}, "spec.registration.alias"),
    _C("alias-version-zero", {"spec.registration.alias": "v0"}, "spec.registration.alias"),
    _C("alias-zero-width", {"spec.registration.alias": "champion\u200b"}, "spec.registration.alias"),
    _C("model-name-dot", {"spec.registration.modelName": "."}, "spec.registration.modelName"),
    _C("model-name-dot-dot", {"spec.registration.modelName": ".."}, "spec.registration.modelName"),
    _C(
        "model-name-leading-dot-dot",
        {"spec.registration.modelName": "..hidden"},
        "spec.registration.modelName",
    ),
    _C("model-name-inner-dot-dot", {"spec.registration.modelName": "a..b"}, "spec.registration.modelName"),
    _C("model-name-backslash", {"spec.registration.modelName": "team\\other"}, "spec.registration.modelName"),
    _C("model-name-slash", {"spec.registration.modelName": "team/other"}, "spec.registration.modelName"),
    _C("model-name-leading-space", {"spec.registration.modelName": " qwen"}, "spec.registration.modelName"),
    _C(
        "model-name-trailing-nbsp",
        {"spec.registration.modelName": "qwen\u00a0"},
        "spec.registration.modelName",
    ),
    _C("model-name-blank", {"spec.registration.modelName": "   "}, "spec.registration.modelName"),
    _C("model-name-zero-width", {"spec.registration.modelName": "qw\u200ben"}, "spec.registration.modelName"),
    _C(
        "model-name-soft-hyphen", {"spec.registration.modelName": "qw\u00aden"}, "spec.registration.modelName"
    ),
    _C(
        "model-name-word-joiner", {"spec.registration.modelName": "qw\u2060en"}, "spec.registration.modelName"
    ),
    _C(
        "model-name-hangul-filler",
        {"spec.registration.modelName": "qw\u3164en"},
        "spec.registration.modelName",
    ),
    _C(
        "model-name-variation-selector",
        {"spec.registration.modelName": "qw\ufe0fen"},
        "spec.registration.modelName",
    ),
    _C(
        "experiment-tag-character",
        {"spec.registration.experiment": "kubetune/x\U000e0041"},
        "spec.registration.experiment",
    ),
    _C("alias-tag-cancel", {"spec.registration.alias": "champion\U000e007f"}, "spec.registration.alias"),
    _C(
        "model-name-rtl-override",
        {"spec.registration.modelName": "qwen\u202egpj"},
        "spec.registration.modelName",
    ),
    _C("model-name-isolate", {"spec.registration.modelName": "qwen\u2066x"}, "spec.registration.modelName"),
    _C("model-name-bom", {"spec.registration.modelName": "\ufeffqwen"}, "spec.registration.modelName"),
    _C("model-name-c1", {"spec.registration.modelName": "qwen\u0085x"}, "spec.registration.modelName"),
    _C("model-name-lrm", {"spec.registration.modelName": "qwen\u200e"}, "spec.registration.modelName"),
    _C(
        "experiment-climbs",
        {"spec.registration.experiment": "/Users/me/../other"},
        "spec.registration.experiment",
    ),
    _C(
        "experiment-dot-part", {"spec.registration.experiment": "/Users/./me"}, "spec.registration.experiment"
    ),
    _C(
        "experiment-double-slash",
        {"spec.registration.experiment": "/Users//me"},
        "spec.registration.experiment",
    ),
    _C("experiment-backslash", {"spec.registration.experiment": "team\\x"}, "spec.registration.experiment"),
    _C(
        "experiment-trailing-space", {"spec.registration.experiment": "team "}, "spec.registration.experiment"
    ),
    _C("experiment-bidi", {"spec.registration.experiment": "team\u202ax"}, "spec.registration.experiment"),
    _C(
        "registered-latest",
        {"spec.model": {"registered": "models:/assistant@latest"}},
        "spec.model.registered",
    ),
    _C(
        "registered-latest-mixed",
        {"spec.model": {"registered": "models:/assistant@Latest"}},
        "spec.model.registered",
    ),
    _C(
        "registered-version-alias",
        {"spec.model": {"registered": "models:/assistant@v3"}},
        "spec.model.registered",
    ),
    _C("registered-dot", {"spec.model": {"registered": "models:/./3"}}, "spec.model.registered"),
    _C("registered-dot-dot", {"spec.model": {"registered": "models:/..@champion"}}, "spec.model.registered"),
    _C(
        "registered-backslash",
        {"spec.model": {"registered": "models:/a\\b@champion"}},
        "spec.model.registered",
    ),
    _C(
        "registered-space-end",
        {"spec.model": {"registered": "models:/assistant @champion"}},
        "spec.model.registered",
    ),
    _C(
        "registered-space-start",
        {"spec.model": {"registered": "models:/ assistant/2"}},
        "spec.model.registered",
    ),
    _C(
        "registered-zero-width",
        {"spec.model": {"registered": "models:/assis\u200dtant@champion"}},
        "spec.model.registered",
    ),
    _C(
        "registered-rtl",
        {"spec.model": {"registered": "models:/assistant\u202e@champion"}},
        "spec.model.registered",
    ),
    _C(
        "registered-version-zero",
        {"spec.model": {"registered": "models:/assistant/0"}},
        "spec.model.registered",
    ),
    # --- rules across fields that were there before ---
    _C("epochs-and-max-steps", {"spec.training.epochs": 1}, "spec.training"),
    _C("neither-epochs-nor-max-steps", {"spec.training.maxSteps": DELETE}, "spec.training"),
    _C("model-name-and-path", {"spec.model.path": "/models/x"}, "spec.model"),
    _C("dataset-name-and-path", {"spec.dataset.path": "/data/x.jsonl"}, "spec.dataset"),
    _C("lora-with-full", {"spec.lora": {"r": 8}}, "spec.lora"),
    _C("warmup-both", {"spec.training.warmupRatio": 0.1}, "spec.training.warmupRatio"),
    _C("eval-split-and-fraction", {"spec.dataset.evalSplit": "test"}, "spec.dataset.evalFraction"),
    _C(
        "tokens-per-step-without-packing",
        {"spec.training.tokensPerStep": 4096, "spec.training.packing": False},
        "spec.training.tokensPerStep",
    ),
    _C("multinode-rwo", _resources(nodes=2), "spec.storage.accessMode"),
    _C(
        "multinode-cpu",
        {**_resources(nodes=2, gpusPerNode=0, gpuProduct=DELETE), "spec.storage.accessMode": "ReadWriteMany"},
        "spec.resources.nodes",
    ),
    _C("gpu-product-without-gpus", _resources(gpusPerNode=0), "spec.resources.gpuProduct"),
    _C("eval-steps-without-eval-data", {"spec.dataset.evalFraction": DELETE}, "spec.training.evalSteps"),
    _C(
        "assistant-loss-on-text",
        {"spec.dataset.format": "text", "spec.training.assistantOnlyLoss": True},
        "spec.training.assistantOnlyLoss",
    ),
    _C(
        "existing-claim-with-class",
        {"spec.storage.existingClaim": "ckpt", "spec.storage.storageClassName": "fast"},
        "spec.storage.storageClassName",
    ),
    _C(
        "lora-target-duplicate",
        {"spec.method": "lora", "spec.lora": {"targetModules": ["q_proj", "q_proj"]}},
        "spec.lora.targetModules[1]",
    ),
    # QLoRA, DoRA, rsLoRA and the target-module preset (issue 34 item 2)
    _C(
        "lora-all-linear-with-others",
        _lora(targetModules=["all-linear", "q_proj"]),
        "spec.lora.targetModules",
    ),
    _C("lora-quantization-unknown", _lora(quantization="int4"), "spec.lora.quantization"),
    _C(
        "qlora-on-cpu",
        {**_lora(quantization="nf4"), **_resources(gpusPerNode=0, gpuProduct=DELETE)},
        "spec.lora.quantization",
    ),
    _C(
        "qlora-fp16",
        {**_lora(quantization="nf4"), "spec.training.precision": "fp16"},
        "spec.training.precision",
    ),
    _C("dora-with-full", {"spec.lora": {"dora": True}}, "spec.lora"),
    # --- chained jobs, the checkpoint catalog and the evaluation gate ---
    _C("model-hub-and-job", {"spec.model.fromJob": {"name": "parent"}}, "spec.model"),
    _C("model-nothing", {"spec.model": {"trustRemoteCode": False}}, "spec.model"),
    _C(
        "model-registered-no-alias",
        {"spec.model": {"registered": "models:/assistant"}},
        "spec.model.registered",
    ),
    _C("model-registered-runs", {"spec.model": {"registered": "runs:/abc/model"}}, "spec.model.registered"),
    _C("model-job-bad-name", {"spec.model": {"fromJob": {"name": "Parent_1"}}}, "spec.model.fromJob.name"),
    _C("model-job-dotted-name", {"spec.model": {"fromJob": {"name": "a.b"}}}, "spec.model.fromJob.name"),
    _C("model-job-name-too-long", {"spec.model": {"fromJob": {"name": "a" * 41}}}, "spec.model.fromJob.name"),
    _C(
        "model-job-bad-checkpoint",
        {"spec.model": {"fromJob": {"name": "parent", "checkpoint": "latest"}}},
        "spec.model.fromJob.checkpoint",
    ),
    _C(
        "model-revision-with-job",
        {"spec.model": {"fromJob": {"name": "p"}, "revision": "v2"}},
        "spec.model.revision",
    ),
    _C(
        "model-from-itself",
        {"metadata.name": "loop", "spec.model": {"fromJob": {"name": "loop"}}},
        "spec.model.fromJob.name",
    ),
    _C("resume-zero", {"spec.resume": "0"}, "spec.resume"),
    _C("resume-word", {"spec.resume": "newest"}, "spec.resume"),
    _C("resume-number", {"spec.resume": 400}, "spec.resume"),
    _C(
        "resume-best-without-eval",
        {"spec.resume": "best", "spec.dataset.evalFraction": DELETE, "spec.training.evalSteps": DELETE},
        "spec.resume",
    ),
    _C(
        "select-best-without-eval",
        {
            "spec.registration.select": "bestEval",
            "spec.dataset.evalFraction": DELETE,
            "spec.training.evalSteps": DELETE,
        },
        "spec.registration.select",
    ),
    _C("select-unknown", {"spec.registration.select": "best"}, "spec.registration.select"),
    _C(
        "gate-without-eval",
        {
            "spec.registration.gate": {"maxEvalLoss": 1.5},
            "spec.dataset.evalFraction": DELETE,
            "spec.training.evalSteps": DELETE,
        },
        "spec.registration.gate",
    ),
    _C(
        "gate-both",
        {"spec.registration.gate": {"maxEvalLoss": 1.5, "minImprovement": 0.1}},
        "spec.registration.gate",
    ),
    _C("gate-empty", {"spec.registration.gate": {}}, "spec.registration.gate"),
    _C(
        "gate-improvement-one",
        {"spec.registration.gate": {"minImprovement": 1}},
        "spec.registration.gate.minImprovement",
    ),
    _C(
        "gate-loss-zero", {"spec.registration.gate": {"maxEvalLoss": 0}}, "spec.registration.gate.maxEvalLoss"
    ),
    _C("subset-climbs-out", {"spec.dataset.subset": "../.."}, "spec.dataset.subset"),
    _C("subset-with-slash", {"spec.dataset.subset": "data/all"}, "spec.dataset.subset"),
    _C(
        "best-eval-between-saves",
        {
            "spec.registration.select": "bestEval",
            "spec.training.evalSteps": 30,
            "spec.training.saveSteps": 25,
        },
        "spec.training.saveSteps",
    ),
    _C(
        "resume-best-eval-between-saves",
        {"spec.resume": "best", "spec.training.evalSteps": 20, "spec.training.saveSteps": 50},
        "spec.training.saveSteps",
    ),
    # --- nothing silently ignored (kubetune_api.rules_ignored): a field refused where it does nothing ---
    _C(
        "data-revision-with-path",
        {**_data_volume(), "spec.dataset.revision": SHA},
        "spec.dataset.revision",
    ),
    _C("data-subset-with-path", {**_data_volume(), "spec.dataset.subset": "en"}, "spec.dataset.subset"),
    _C(
        "data-seed-without-eval-fraction",
        {"spec.dataset.evalFraction": DELETE, "spec.dataset.evalSplit": "test", "spec.dataset.seed": 7},
        "spec.dataset.seed",
    ),
    _C(
        "storage-size-with-existing-claim",
        {"spec.storage": {"existingClaim": "ckpt", "size": "50Gi"}},
        "spec.storage.size",
    ),
    _C(
        "storage-access-mode-with-existing-claim",
        {"spec.storage": {"existingClaim": "ckpt", "accessMode": "ReadWriteMany"}},
        "spec.storage.accessMode",
    ),
    _C(
        "storage-keep-with-existing-claim",
        {"spec.storage": {"existingClaim": "ckpt", "keepOnDelete": True}},
        "spec.storage.keepOnDelete",
    ),
    _C("warmup-steps-with-constant", {"spec.training.lrScheduler": "constant"}, "spec.training.lrScheduler"),
    _C(
        "warmup-ratio-with-constant",
        {
            "spec.training.lrScheduler": "constant",
            "spec.training.warmupSteps": DELETE,
            "spec.training.warmupRatio": 0.1,
        },
        "spec.training.lrScheduler",
    ),
    _C(
        "watchdog-settings-while-off",
        {"spec.training.lossWatchdog": {"enabled": False, "patience": 5}},
        "spec.training.lossWatchdog.enabled",
    ),
    _C("merge-lora-off-with-full", {"spec.registration.mergeLora": False}, "spec.registration.mergeLora"),
    # --- data set layouts (issue 34 item 3): each layout's own columns, roles where rows have them ---
    _C("layout-unknown", {"spec.dataset.layout": "openai"}, "spec.dataset.layout"),
    _C(
        "layout-sharegpt-as-text",
        {"spec.dataset.layout": "sharegpt", "spec.dataset.format": "text"},
        "spec.dataset.format",
    ),
    _C(
        "layout-alpaca-prompt-completion",
        {"spec.dataset.layout": "alpaca", "spec.dataset.format": "promptCompletion"},
        "spec.dataset.format",
    ),
    _C("columns-prompt-with-sharegpt", _layout("sharegpt", columns={"prompt": "q"}), "spec.dataset.columns"),
    _C(
        "columns-messages-with-alpaca",
        _layout("alpaca", columns={"messages": "turns"}),
        "spec.dataset.columns",
    ),
    _C("columns-instruction-native", _layout("native", columns={"instruction": "q"}), "spec.dataset.columns"),
    _C("columns-system-native", _layout("native", columns={"system": "sys"}), "spec.dataset.columns"),
    _C("columns-empty-name", _layout("sharegpt", columns={"messages": ""}), "spec.dataset.columns.messages"),
    _C("columns-newline", _layout("alpaca", columns={"output": "a\nb"}), "spec.dataset.columns.output"),
    _C("roles-with-alpaca", _layout("alpaca", roles={"human": "user"}), "spec.dataset.roles"),
    _C(
        "roles-with-text",
        {"spec.dataset.format": "text", "spec.dataset.roles": {"human": "user"}},
        "spec.dataset.roles",
    ),
    _C("roles-to-unknown-role", _layout("sharegpt", roles={"bot": "robot"}), "spec.dataset.roles"),
    _C(
        "system-prompt-with-prompt-completion",
        {"spec.dataset.format": "promptCompletion", "spec.dataset.systemPrompt": "Be brief."},
        "spec.dataset.systemPrompt",
    ),
    _C("system-prompt-empty", {"spec.dataset.systemPrompt": ""}, "spec.dataset.systemPrompt"),
    # --- budgets ---
    _C("budget-empty", {"spec.budget": {}}, "spec.budget"),
    _C("budget-register-only", {"spec.budget": {"register": False}}, "spec.budget"),
    _C("budget-zero-seconds", {"spec.budget": {"maxDuration": "0s"}}, "spec.budget.maxDuration"),
    _C("budget-zero-hours", {"spec.budget": {"maxDuration": "0h00m"}}, "spec.budget.maxDuration"),
    _C("budget-gpu-hours-zero", {"spec.budget": {"maxGpuHours": 0}}, "spec.budget.maxGpuHours"),
    _C("model-null", {"spec.model": None}, "spec.model"),
    _C("name-too-long", {"metadata.name": "a" * 41}, "metadata.name"),
    _C("name-starts-with-digit", {"metadata.name": "1st-job"}, "metadata.name"),
    # --- preference tuning (issue 34 item 1): pairs as named, nothing of SFT's that would do nothing ---
    _C("objective-unknown", _prefer("kto"), "spec.objective"),
    _C("objective-uppercase", _prefer("DPO"), "spec.objective"),
    _C("preference-with-sft", {"spec.preference": {"beta": 0.1}}, "spec.preference"),
    _C("preference-beta-zero", _prefer(**{"spec.preference": {"beta": 0}}), "spec.preference.beta"),
    _C(
        "dpo-format-messages",
        {"spec.objective": "dpo", "spec.dataset.format": "messages"},
        "spec.dataset.format",
    ),
    _C("orpo-format-text", _prefer("orpo", **{"spec.dataset.format": "text"}), "spec.dataset.format"),
    _C("dpo-layout-sharegpt", _prefer(**{"spec.dataset.layout": "sharegpt"}), "spec.dataset.layout"),
    _C("dpo-columns", _prefer(**{"spec.dataset.columns": {"prompt": "question"}}), "spec.dataset.columns"),
    _C("dpo-roles", _prefer(**{"spec.dataset.roles": {"human": "user"}}), "spec.dataset.roles"),
    _C(
        "orpo-system-prompt",
        _prefer("orpo", **{"spec.dataset.systemPrompt": "Be brief."}),
        "spec.dataset.systemPrompt",
    ),
    _C(
        "dpo-assistant-only-loss",
        _prefer(**{"spec.training.assistantOnlyLoss": True}),
        "spec.training.assistantOnlyLoss",
    ),
    _C(
        "dpo-tokens-per-step", _prefer(**{"spec.training.tokensPerStep": 8192}), "spec.training.tokensPerStep"
    ),
    # the training engine: one kubetune runs on (issue 31), spelt as the kind
    _C("engine-unknown", {"spec.engine": "MPIJob"}, "spec.engine"),
    _C("engine-lowercase", {"spec.engine": "trainjob"}, "spec.engine"),
]

VALID: list[Case] = [
    _C("engine-trainjob", {"spec.engine": "TrainJob"}, ""),
    _C("engine-pytorchjob", {"spec.engine": "PyTorchJob"}, ""),
    # the examples of QLoRA and DoRA whole, and each switch alone (issue 34 item 2)
    _C("example-qwen3-4b-dora", _example_spec("qwen3-4b-dora.yaml"), ""),
    _C("example-qwen3-4b-qlora-24gb", _example_spec("qwen3-4b-qlora-24gb.yaml"), ""),
    _C("lora-all-linear", _lora(targetModules=["all-linear"]), ""),
    # preference tuning (issue 34 item 1): the SFT -> DPO chain whole, each objective with each method
    _C("example-sft-dpo-chain-sft", _example_spec("sft-dpo-chain.yaml", 0), ""),
    _C("example-sft-dpo-chain-dpo", _example_spec("sft-dpo-chain.yaml", 1), ""),
    _C("dpo-full", _prefer(), ""),
    _C("orpo-full-beta", _prefer("orpo", **{"spec.preference": {"beta": 0.25}}), ""),
    _C("dpo-lora", {**_prefer(), **_lora(r=16)}, ""),
    _C("dpo-qlora", {**_prefer(), **_lora(quantization="nf4")}, ""),
    _C("orpo-dora", {**_prefer("orpo"), **_lora(dora=True)}, ""),
    _C("sft-objective-explicit", {"spec.objective": "sft"}, ""),
    _C("dpo-packing-default", _prefer(**{"spec.training.packing": True}), ""),
    _C("lora-dora", _lora(dora=True), ""),
    _C("lora-rslora", _lora(rsLora=True, r=256, alpha=16), ""),
    _C("qlora-dora", _lora(quantization="nf4", dora=True), ""),
    _C("lora-quantization-none", _lora(quantization="none"), ""),
    _C(
        "best-eval-every-second-save",
        {"spec.registration.select": "bestEval", "spec.training.evalSteps": 4, "spec.training.saveSteps": 2},
        "",
    ),
    _C(
        "best-eval-every-other-save",
        {"spec.resume": "best", "spec.training.evalSteps": 25, "spec.training.saveSteps": 50},
        "",
    ),
    _C("subset-dotted", {"spec.dataset.subset": "20231101.en"}, ""),
    # data set layouts: each with its own columns, roles and a system prompt
    _C("layout-native-default", {"spec.dataset.layout": "native"}, ""),
    _C(
        "layout-sharegpt-mapped",
        _layout(
            "sharegpt",
            columns={"messages": "dialog", "role": "speaker", "content": "text", "system": "sys"},
            roles={"bot": "assistant", "human": "user", "function": "tool"},
            systemPrompt="You are a helpful assistant.\nAnswer briefly.",
        ),
        "",
    ),
    _C(
        "layout-alpaca-mapped",
        {
            **_layout("alpaca", columns={"instruction": "q", "input": "context", "output": "a"}),
            "spec.dataset.format": "auto",
        },
        "",
    ),
    _C(
        "layout-native-renamed",
        {
            **_layout("native", columns={"prompt": "question", "completion": "answer"}),
            "spec.dataset.format": "promptCompletion",
        },
        "",
    ),
    _C("layout-native-roles", _layout("native", roles={"human": "user", "gpt": "assistant"}), ""),
    # ... each field of rules_ignored where it has its effect, or at its default
    _C("data-seed-with-eval-fraction", {"spec.dataset.seed": 7}, ""),
    _C("data-path-main-revision", {**_data_volume(), "spec.dataset.revision": "main"}, ""),
    _C("storage-existing-claim-defaults", {"spec.storage": {"existingClaim": "ckpt", "size": "100Gi"}}, ""),
    _C(
        "constant-without-warmup",
        {"spec.training.lrScheduler": "constant", "spec.training.warmupSteps": DELETE},
        "",
    ),
    _C("constant-with-warmup", {"spec.training.lrScheduler": "constant_with_warmup"}, ""),
    _C("watchdog-off", {"spec.training.lossWatchdog": {"enabled": False}}, ""),
    _C("watchdog-tuned", {"spec.training.lossWatchdog": {"patience": 5, "window": 50}}, ""),
    _C("merge-lora-off-with-lora", {"spec.method": "lora", "spec.registration.mergeLora": False}, ""),
    # kept: registration can be turned on later (the other fields then apply; the Succeeded event says so)
    _C(
        "registration-off-with-alias-and-gate",
        {"spec.registration.enabled": False, "spec.registration.gate": {"maxEvalLoss": 2}},
        "",
    ),
    _C("budget-duration", {"spec.budget": {"maxDuration": "0h90m"}}, ""),
    _C("budget-gpu-hours", {"spec.budget": {"maxGpuHours": 0.5, "register": False}}, ""),
    _C("resume-step", {"spec.resume": "400"}, ""),
    _C("resume-none", {"spec.resume": "none"}, ""),
    _C("resume-best", {"spec.resume": "best"}, ""),
    _C(
        "gate-any-improvement",
        {"spec.registration.gate": {"minImprovement": 0}, "spec.registration.select": "bestEval"},
        "",
    ),
    _C("model-registered-alias", {"spec.model": {"registered": "models:/team-assistant@champion"}}, ""),
    _C("model-registered-version", {"spec.model": {"registered": "models:/assistant/12"}}, ""),
    _C("model-from-job", {"spec.model": {"fromJob": {"name": "parent", "checkpoint": "bestEval"}}}, ""),
    _C("cpu-milli", _resources(cpu="500m"), ""),
    _C("cpu-fraction", _resources(cpu="0.5"), ""),
    _C("cpu-exponent", _resources(cpu="1e3"), ""),
    _C("memory-fraction-Gi", _resources(memory="1.5Gi"), ""),
    _C("shm-Ki", _resources(sharedMemory="1Ki"), ""),
    _C("storage-Ti", {"spec.storage.size": "1Ti"}, ""),
    _C("model-volume-subpath", _model_volume(subPath="models/qwen3"), ""),
    _C("subpath-dots-in-name", _model_volume(subPath="a..b/.cache"), ""),
    _C(
        "model-and-data-volumes-apart",
        {**_model_volume("/models"), **_data_volume("/data/train.jsonl", subPath="train.jsonl")},
        "",
    ),
    _C("data-next-to-checkpoints", _data_volume("/var/lib/kubetune-data"), ""),
    _C("data-tmp-prefix", _data_volume("/tmpdata/x.jsonl"), ""),
    _C("data-hidden-file", _data_volume("/data/.train.jsonl"), ""),
    _C(
        "env-ordinary",
        _env(
            {"name": "NCCL_DEBUG", "value": "INFO"},
            {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
            {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
            {"name": "HF_HUB_DOWNLOAD_TIMEOUT", "value": "60"},
            {"name": "MLFLOW_HTTP_REQUEST_TIMEOUT", "value": "300"},
            {"name": "KUBETUNE_FAULT_INJECT", "value": ""},
            {"name": "KUBETUNE_GPU_MEMORY_GIB", "value": "70"},
            {"name": "MY_RANK", "value": "0"},
            {"name": "PATHS", "value": "/x"},
            {"name": "MY_PATH", "value": "/x"},
            {"name": "LDFLAGS", "value": "-O2"},
            {"name": "DATA_URL", "value": "https://h/x?page=2"},
            {"name": "DB", "value": "postgres://db/x"},
            {"name": "REPO", "value": "git@github.com:o/r.git"},
            {"name": "KUBETUNE_SHARDING", "value": ""},
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}},
        ),
        "",
    ),
    _C(
        "tracking-uri-query", {"spec.registration.trackingUri": "https://mlflow.example.com/?workspace=a"}, ""
    ),
    _C("registry-uri-unity-catalog", {"spec.registration.registryUri": "databricks-uc"}, ""),
    _C("registry-uri-databricks-profile", {"spec.registration.registryUri": "databricks-uc://prod"}, ""),
    _C("registry-uri-server", {"spec.registration.registryUri": "https://registry.example.com"}, ""),
    _C("registry-uri-sqlite", {"spec.registration.registryUri": "sqlite:////data/registry.db"}, ""),
    # near misses of the credential shapes: not a word start, too short, another parameter
    _C(
        "credential-shapes-near-misses",
        {
            **_env(
                {"name": "TASK", "value": "task-scheduler-with-a-long-name-1234"},
                {"name": "CACHE", "value": "/models/hf_cache"},
                {"name": "REF", "value": "ghp_short"},
                {"name": "SIGNAL", "value": "https://h/x?signal=1&design=2"},
                {"name": "ID", "value": "AKIAIOSFODNN7EXAMPLEXX"},
            ),
            "spec.registration.modelName": "disk-" + "a" * 30,
        },
        "",
    ),
    _C(
        "node-selector-label-keys",
        _resources(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H100", "zone": "", "k" * 63: "v" * 63}),
        "",
    ),
    _C("toleration-everything", _tolerations({"operator": "Exists"}), ""),
    _C(
        "tolerations-usual",
        _tolerations(
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "spot",
                "operator": "Equal",
                "value": "true",
                "effect": "NoExecute",
                "tolerationSeconds": 30,
            },
        ),
        "",
    ),
    _C("storage-class-dotted", {"spec.storage.storageClassName": "fast.ssd-1"}, ""),
    _C("revision-pr", {"spec.model.revision": "refs/pr/1"}, ""),
    _C("revision-tag", {"spec.model.revision": "v1.0"}, ""),
    _C("revision-sha", {"spec.model.revision": SHA}, ""),
    _C("revision-branch", {"spec.dataset.revision": "feature/x-y_z"}, ""),
    _C("model-name-spaces", {"spec.registration.modelName": "Qwen3 assistant (v2)"}, ""),
    _C("experiment-slashes", {"spec.registration.experiment": "/Users/me/kubetune"}, ""),
    _C("image-registry-port", {"spec.image": "registry.example.com:5000/team/trainer:v1.2.3"}, ""),
    _C("image-short", {"spec.image": "trainer"}, ""),
    _C("image-digest", {"spec.image": f"ghcr.io/org/trainer@{DIGEST}"}, ""),
    _C("image-tag-and-digest", {"spec.image": f"localhost/trainer:latest@{DIGEST}"}, ""),
    _C("alias-v1beta", {"spec.registration.alias": "v1beta"}, ""),
    _C("alias-latest-suffix", {"spec.registration.alias": "latest_good"}, ""),
    _C("model-name-dots-apart", {"spec.registration.modelName": "qwen3.5-final.v2"}, ""),
    _C("model-name-unicode-letters", {"spec.registration.modelName": "modèle-助手"}, ""),
    _C("experiment-workspace-path", {"spec.registration.experiment": "/Shared/team-a/qwen3"}, ""),
    _C("registered-dotted-name", {"spec.model": {"registered": "models:/team.assistant@champion_v2"}}, ""),
    _C("registered-name-inner-space", {"spec.model": {"registered": "models:/team assistant/3"}}, ""),
]


# Fields given as null: each admitted by kubectl create, by server-side apply and by the Python check,
# and stored as the same spec as with the field left out (tests/integration/test_admission_table.py).
NULLS: list[Case] = [
    _C("null-budget", {"spec.budget": None}, ""),
    _C("null-lora-with-full", {"spec.lora": None}, ""),
    _C("null-from-job", {"spec.model.fromJob": None}, ""),
    _C("null-registered", {"spec.model.registered": None}, ""),
    _C("null-model-volume", {"spec.model.volume": None}, ""),
    _C("null-gate", {"spec.registration.gate": None}, ""),
    _C("null-alias", {"spec.registration.alias": None}, ""),
    _C("null-secrets", {"spec.secrets": None}, ""),
    _C("null-secret-ref", {"spec.secrets": {"huggingFaceToken": None}}, ""),
    _C("null-env", {"spec.env": None}, ""),
    _C("null-env-value-from", _env({"name": "NCCL_DEBUG", "value": "INFO", "valueFrom": None}), ""),
    _C("null-tolerations", _resources(tolerations=None), ""),
    _C("null-node-selector", _resources(nodeSelector=None), ""),
    _C("null-cpu", _resources(cpu=None), ""),
    _C("null-eval-data", {"spec.dataset.evalFraction": None, "spec.training.evalSteps": None}, ""),
    # fields with a default: the default, as when left out
    _C("null-registration", {"spec.registration": None}, ""),
    _C("null-storage", {"spec.storage": None}, ""),
    _C("null-loss-watchdog", {"spec.training.lossWatchdog": None}, ""),
    _C("null-method", {"spec.method": None}, ""),
    _C("null-engine", {"spec.engine": None}, ""),
    # a nullable field with a few values (operator, effect): a pattern the API server skips for null
    _C(
        "null-toleration-operator-effect",
        _resources(
            tolerations=[{"key": "nvidia.com/gpu", "operator": None, "value": "present", "effect": None}]
        ),
        "",
    ),
]


def left_out(case: Case) -> Case:
    """``case`` with each field it sets to null left out instead."""

    def drop(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: drop(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [drop(v) for v in value]
        return value

    return Case(case.id, {k: DELETE if v is None else drop(v) for k, v in case.change.items()}, "")


def named(cases: list[Case], prefix: str) -> dict[str, Case]:
    """Each case under the object name it is sent with: its own when it changes metadata.name."""
    out: dict[str, Case] = {}
    for i, case in enumerate(cases):
        name = case.change.get("metadata.name") or f"{prefix}-{i:03d}"
        assert name not in out, name
        out[name] = case
    return out


def manifests(cases: dict[str, Case]) -> list[dict[str, Any]]:
    return [case.manifest(name) for name, case in cases.items()]


Check = Callable[[dict[str, Any]], list[str]]
