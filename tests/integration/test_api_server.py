"""The FineTuneJob API on a real kube-apiserver: schema, CEL rules, defaults, immutability."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.controlplane import ControlPlane

from kubetune_api.spec import FineTuneJobSpec

pytestmark = pytest.mark.integration

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))

VALID: dict[str, Any] = {
    "apiVersion": "kubetune.io/v1alpha1",
    "kind": "FineTuneJob",
    "metadata": {"name": "valid"},
    "spec": {
        "model": {"name": "Qwen/Qwen2-0.5B"},
        "dataset": {"name": "trl-lib/Capybara"},
        "training": {"maxSteps": 10},
    },
}

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def apply(obj: dict[str, Any]) -> None:
        node = obj
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value

    return apply


def _del(path: str) -> Mutation:
    def apply(obj: dict[str, Any]) -> None:
        node = obj
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[k]
        del node[keys[-1]]

    return apply


def _all(*muts: Mutation) -> Mutation:
    def apply(obj: dict[str, Any]) -> None:
        for m in muts:
            m(obj)

    return apply


# (id, mutation, text the API server's message must contain: the offending field)
INVALID: list[tuple[str, Mutation, str]] = [
    ("no-training", _del("spec.training"), "spec.training"),
    (
        "epochs-and-maxsteps",
        _set("spec.training.epochs", 1),
        "exactly one of training.epochs or training.maxSteps",
    ),
    (
        "neither-epochs-nor-maxsteps",
        _set("spec.training", {"batchSize": 2}),
        "training.epochs or training.maxSteps",
    ),
    ("unknown-method", _set("spec.method", "qlora"), "spec.method"),
    ("lora-with-full", _all(_set("spec.method", "full"), _set("spec.lora", {"r": 8})), "spec.lora"),
    ("lora-rank-zero", _set("spec.lora", {"r": 0}), "spec.lora.r"),
    ("lora-dropout-one", _set("spec.lora", {"dropout": 1.0}), "spec.lora.dropout"),
    ("lora-no-target-modules", _set("spec.lora", {"targetModules": []}), "spec.lora.targetModules"),
    ("learning-rate-zero", _set("spec.training.learningRate", 0), "spec.training.learningRate"),
    ("batch-size-zero", _set("spec.training.batchSize", 0), "spec.training.batchSize"),
    ("precision-int8", _set("spec.training.precision", "int8"), "spec.training.precision"),
    (
        "checkpointing-bool",
        _set("spec.training.gradientCheckpointing", True),
        "spec.training.gradientCheckpointing",
    ),
    ("max-length-tiny", _set("spec.training.maxLength", 8), "spec.training.maxLength"),
    (
        "warmup-both",
        _all(_set("spec.training.warmupSteps", 5), _set("spec.training.warmupRatio", 0.1)),
        "spec.training.warmupRatio",
    ),
    ("eval-steps-without-eval-data", _set("spec.training.evalSteps", 10), "spec.training.evalSteps"),
    (
        "tokens-per-step-without-packing",
        _all(_set("spec.training.tokensPerStep", 4096), _set("spec.training.packing", False)),
        "spec.training.tokensPerStep",
    ),
    ("model-name-and-path", _set("spec.model.path", "/models/x"), "spec.model"),
    ("model-neither", _set("spec.model", {"revision": "main"}), "spec.model"),
    ("model-relative-path", _set("spec.model", {"path": "models/x"}), "spec.model.path"),
    ("model-volume-without-path", _set("spec.model.volume", {"claimName": "models"}), "spec.model.volume"),
    ("model-bad-hub-id", _set("spec.model.name", "not a hub id!"), "spec.model.name"),
    (
        "dataset-split-and-fraction",
        _all(_set("spec.dataset.evalSplit", "test"), _set("spec.dataset.evalFraction", 0.1)),
        "spec.dataset.evalFraction",
    ),
    ("dataset-fraction-above-one", _set("spec.dataset.evalFraction", 1.5), "spec.dataset.evalFraction"),
    ("dataset-format-csv", _set("spec.dataset.format", "csv"), "spec.dataset.format"),
    (
        "assistant-loss-on-text",
        _all(_set("spec.dataset.format", "text"), _set("spec.training.assistantOnlyLoss", True)),
        "spec.training.assistantOnlyLoss",
    ),
    ("gpus-per-node-17", _set("spec.resources", {"gpusPerNode": 17}), "spec.resources.gpusPerNode"),
    ("nodes-zero", _set("spec.resources", {"nodes": 0}), "spec.resources.nodes"),
    ("multinode-rwo", _set("spec.resources", {"nodes": 2, "gpusPerNode": 8}), "spec.storage.accessMode"),
    (
        "multinode-cpu",
        _all(
            _set("spec.resources", {"nodes": 2, "gpusPerNode": 0}),
            _set("spec.storage", {"accessMode": "ReadWriteMany"}),
        ),
        "spec.resources.nodes",
    ),
    (
        "gpu-product-without-gpus",
        _set("spec.resources", {"gpusPerNode": 0, "gpuProduct": "NVIDIA-H100"}),
        "spec.resources.gpuProduct",
    ),
    ("memory-not-a-quantity", _set("spec.resources", {"memory": "lots"}), "spec.resources.memory"),
    (
        "toleration-operator",
        _set("spec.resources", {"tolerations": [{"key": "gpu", "operator": "Sometimes"}]}),
        "spec.resources.tolerations[0].operator",
    ),
    (
        "priority-class-uppercase",
        _set("spec.resources", {"priorityClassName": "High_Prio"}),
        "spec.resources.priorityClassName",
    ),
    (
        "existing-claim-with-class",
        _set("spec.storage", {"existingClaim": "ckpt", "storageClassName": "fast"}),
        "spec.storage.storageClassName",
    ),
    ("storage-size-not-quantity", _set("spec.storage", {"size": "big"}), "spec.storage.size"),
    (
        "inline-hf-token",
        _set("spec.secrets", {"huggingFaceToken": "hf_abcdef"}),
        "spec.secrets.huggingFaceToken",
    ),
    (
        "secret-ref-without-key",
        _set("spec.secrets", {"huggingFaceToken": {"name": "hf"}}),
        "spec.secrets.huggingFaceToken.key",
    ),
    ("inline-secret-env", _set("spec.env", [{"name": "WANDB_API_KEY", "value": "abc"}]), "spec.env[0].value"),
    (
        "env-tuning-typo",
        _set(
            "spec.env",
            [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "KUBETUNE_SHARDING", "value": "fsdp"}],
        ),
        "spec.env[1].value: Invalid value: KUBETUNE_SHARDING must be ddp or fsdp2",
    ),
    (
        "env-operator-owned",
        _set("spec.env", [{"name": "KUBETUNE_CONFIG", "value": "/tmp/mine.yaml"}]),
        "spec.env[0].name: Invalid value: spec.env[].name must not be a kubetune control variable (KUBETUNE_*)",
    ),
    (
        "env-tuning-not-a-number",
        _set("spec.env", [{"name": "KUBETUNE_DDP_BUCKET_MB", "value": "0"}]),
        "KUBETUNE_DDP_BUCKET_MB must be a whole number of megabytes",
    ),
    (
        "env-value-and-from",
        _set(
            "spec.env",
            [{"name": "X", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        ),
        "spec.env[0]",
    ),
    ("registration-bad-alias", _set("spec.registration", {"alias": "my alias!"}), "spec.registration.alias"),
    (
        "registration-bad-uri",
        _set("spec.registration", {"trackingUri": "mlflow-server:5000"}),
        "spec.registration.trackingUri",
    ),
    # names MLflow reserves: accepted, the model would be registered and its alias refused after training
    (
        "registration-alias-latest",
        _set("spec.registration", {"alias": "Latest"}),
        "spec.registration.alias must not be 'latest' or v<number>",
    ),
    (
        "registration-alias-version",
        _set("spec.registration", {"alias": "v2"}),
        "spec.registration.alias must not be 'latest' or v<number>",
    ),
    (
        "registration-uri-with-credentials",
        _set("spec.registration", {"trackingUri": "https://bob:hunter2@mlflow.example.com"}),
        "spec.registration.trackingUri must not carry credentials",
    ),
    ("typo-field", _set("spec.trainng", {"maxSteps": 1}), 'unknown field "spec.trainng"'),
    ("name-too-long", _set("metadata.name", "a" * 41), "metadata.name"),
    ("name-starts-with-digit", _set("metadata.name", "1st-job"), "metadata.name"),
]


def _manifest(mutation: Mutation | None = None, name: str | None = None) -> dict[str, Any]:
    obj = copy.deepcopy(VALID)
    if name:
        obj["metadata"]["name"] = name
    if mutation:
        mutation(obj)
    return obj


def test_valid_baseline_is_accepted(control_plane: ControlPlane, namespace: str) -> None:
    out = control_plane.kubectl(
        "create", "-n", namespace, "--dry-run=server", "-f", "-", input=json.dumps(_manifest())
    )
    assert "created (server dry run)" in out.stdout


@pytest.mark.parametrize(
    ("mutation", "field"), [(m, f) for _, m, f in INVALID], ids=[i for i, _, _ in INVALID]
)
def test_invalid_job_is_rejected_naming_the_field(
    control_plane: ControlPlane, namespace: str, mutation: Mutation, field: str
) -> None:
    out = control_plane.kubectl(
        "create",
        "-n",
        namespace,
        "--dry-run=server",
        "-f",
        "-",
        input=json.dumps(_manifest(mutation)),
        check=False,
    )
    assert out.returncode != 0, f"accepted: {out.stdout}"
    assert field in out.stderr, out.stderr
    # nothing half-created
    assert control_plane.kubectl("get", "ftj", "-n", namespace, "-o", "name").stdout.strip() == ""


def test_table_has_at_least_25_distinct_cases() -> None:
    assert len({i for i, _, _ in INVALID}) == len(INVALID) >= 25


def test_kubectl_explain_shows_documented_fields(control_plane: ControlPlane) -> None:
    out = control_plane.kubectl("explain", "ftj.spec").stdout
    for name in (
        "model",
        "dataset",
        "method",
        "lora",
        "training",
        "resources",
        "storage",
        "registration",
        "secrets",
        "suspend",
    ):
        assert f"  {name}\t" in out or f"  {name} " in out, (name, out)
    assert "Hyperparameters; set exactly one of epochs or maxSteps." in out
    leaf = control_plane.kubectl("explain", "ftj.spec.training.gradientCheckpointing").stdout
    assert "Recompute activations to save memory" in leaf and "ENUM" in leaf


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_are_accepted_by_kubectl_apply(
    control_plane: ControlPlane, namespace: str, example: Path
) -> None:
    out = control_plane.kubectl("apply", "-n", namespace, "-f", str(example))
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d]  # a chain holds several jobs
    assert out.stdout.count("created") == len(docs)
    for doc in docs:
        stored = json.loads(
            control_plane.kubectl("get", "ftj", doc["metadata"]["name"], "-n", namespace, "-o", "json").stdout
        )
        # the API server keeps every field the example sets (nothing pruned)
        assert _contains(stored["spec"], doc["spec"])


def _contains(big: Any, small: Any) -> bool:
    if isinstance(small, dict):
        return all(k in big and _contains(big[k], v) for k, v in small.items())
    return bool(big == small)


def test_server_defaults_equal_model_defaults(control_plane: ControlPlane, namespace: str) -> None:
    """The API server fills in the same defaults as the typed model (local runs and cluster agree)."""
    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(_manifest(name="defaults")))
    stored = json.loads(control_plane.kubectl("get", "ftj", "defaults", "-n", namespace, "-o", "json").stdout)
    assert stored["spec"] == FineTuneJobSpec.model_validate(VALID["spec"]).wire()


def _patch(cp: ControlPlane, ns: str, name: str, patch: dict[str, Any], check: bool = False) -> Any:
    return cp.kubectl("patch", "ftj", name, "-n", ns, "--type=merge", "-p", json.dumps(patch), check=check)


def test_training_shaping_fields_are_immutable(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(_manifest(name="immutable")))
    cases = [
        ({"spec": {"training": {"learningRate": 0.5}}}, "spec.training is immutable"),
        ({"spec": {"model": {"revision": "v2"}}}, "spec.model is immutable"),
        ({"spec": {"method": "full"}}, "spec.method is immutable"),
        ({"spec": {"lora": {"r": 16}}}, "spec.lora is immutable"),
        ({"spec": {"resources": {"gpusPerNode": 2}}}, "spec.resources is immutable"),
        ({"spec": {"registration": {"modelName": "other"}}}, "spec.registration.modelName is immutable"),
    ]
    for patch, message in cases:
        out = _patch(control_plane, namespace, "immutable", patch)
        assert out.returncode != 0 and message in out.stderr, (patch, out.stderr)
    # suspend and the registration alias may change
    assert _patch(control_plane, namespace, "immutable", {"spec": {"suspend": True}}).returncode == 0
    assert (
        _patch(
            control_plane, namespace, "immutable", {"spec": {"registration": {"alias": "champion"}}}
        ).returncode
        == 0
    )
    stored = json.loads(
        control_plane.kubectl("get", "ftj", "immutable", "-n", namespace, "-o", "json").stdout
    )
    assert stored["spec"]["suspend"] is True
    assert stored["spec"]["registration"]["alias"] == "champion"
    assert stored["spec"]["training"]["learningRate"] == pytest.approx(1e-4)


NOW = "2026-12-03T06:00:00Z"
PREPARATION = {
    "tokenizedKey": "0123456789abcdef",
    "data": {
        "trainExamples": 1800,
        "evalExamples": 200,
        "tokens": 912000,
        "lengthP50": 410,
        "lengthP95": 1020,
        "lengthMax": 3900,
        "truncatedFraction": 0.04,
        "lossTokenFraction": 0.38,
    },
    "estimate": {
        "gpuProduct": "NVIDIA-H100-80GB-HBM3",
        "gpus": 8,
        "gpuMemoryGib": 80,
        "peakMemoryGib": 41.5,
        "fits": True,
        "microBatchRows": 8,
        "microBatchTokens": 8192,
        "gradientAccumulationSteps": 1,
        "gradientCheckpointing": False,
        "sharding": "ddp",
        "steps": 14,
        "tokensPerSecond": 250000,
        "durationSeconds": 1800,
        "gpuHours": 0.5,
    },
}


def test_status_subresource_and_printer_columns(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(_manifest(name="columns")))
    status = {
        "status": {
            "phase": "Training",
            "progress": {"step": 30, "totalSteps": 120, "percent": 25, "loss": 1.25},
            "registeredModel": {"name": "qwen-assistant", "version": "3"},
            "preparation": PREPARATION,
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "TrainingRunning", "lastTransitionTime": NOW}
            ],
        }
    }
    control_plane.kubectl(
        "patch",
        "ftj",
        "columns",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    table = control_plane.kubectl("get", "ftj", "columns", "-n", namespace).stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "PHASE",
        "PROGRESS",
        "LOSS",
        "TOKENS",
        "EST-GPU-H",
        "MODEL",
        "VERSION",
        "AGE",
    ]
    assert table[1].split()[:8] == [
        "columns",
        "Training",
        "25",
        "1.25",
        "912000",
        "0.5",
        "qwen-assistant",
        "3",
    ]
    wide = control_plane.kubectl("get", "ftj", "columns", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[6] == "REASON" and wide[1].split()[6] == "TrainingRunning"
    # spec is not writable through the status subresource, status not through the main resource
    _patch(control_plane, namespace, "columns", {"status": {"phase": "Failed"}}, check=True)
    stored = json.loads(control_plane.kubectl("get", "ftj", "columns", "-n", namespace, "-o", "json").stdout)
    assert stored["status"]["phase"] == "Training"
