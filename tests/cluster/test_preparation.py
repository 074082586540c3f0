"""The preparation step through the real controllers: the Job controller runs the preparation Job
(its pod run by the pod runner, the real ``kubetune_trainer.prepare``), the operator reads its
report or refusal, and only then creates the training child (a PyTorchJob or a TrainJob: each test
runs on both engines).

The Hugging Face Hub is the one thing stood in for here: :mod:`tests.support.hub` serves the tiny
model and data through the Hub's download protocol on 127.0.0.1 (``KUBETUNE_HF_ENDPOINT``), and
counts the requests it answers.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubetune_api.preparation import HINTS, Refusal
from tests.cluster.conftest import TESTDATA_DIR, operator_env, tiny_job, wait_for
from tests.cluster.test_real_controllers import (
    CHILD_KINDS,
    ENGINES,
    TRAIN_TIMEOUT,
    apply_job,
    checkpoint_folder,
    explained,
    first_node_pod,
    get,
    job_status,
    on,
    versions,
    wait_phase,
)
from tests.support.cluster import Cluster
from tests.support.hub import HubStandIn
from tests.support.mlflow_server import MlflowServer
from tests.support.operator import OperatorProcess

MODEL_REPO = "kubetune/tiny-chat-model"
DATA_REPO = "kubetune/tiny-chat"
GATED_REPO = "kubetune/gated-model"
GATED_TOKEN = "hf_gatedtoken_for_tests_only"


@pytest.fixture(scope="module")
def hub(tiny_image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandIn]:
    data = tmp_path_factory.mktemp("hub-data")
    shutil.copy(tiny_image / "data" / "tiny-chat.jsonl", data / "train.jsonl")
    server = HubStandIn(tmp_path_factory.mktemp("hub"))
    server.add_model(MODEL_REPO, tiny_image / "model")
    server.add_model(GATED_REPO, tiny_image / "model", gated_token=GATED_TOKEN)
    server.add_dataset(DATA_REPO, data)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub_operator(
    cluster: Cluster, mlflow_server: MlflowServer, hub: HubStandIn, ns: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    env = {**operator_env(cluster, mlflow_server), "KUBETUNE_HF_ENDPOINT": hub.endpoint}
    proc = OperatorProcess(ns, env, tmp_path / "operator.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


def hub_job(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    doc = tiny_job(name, ns, **spec)
    doc["spec"]["model"] = {"name": MODEL_REPO}
    doc["spec"]["dataset"] = {"name": DATA_REPO, "format": "messages", "evalFraction": 0.1, "seed": 42}
    return doc


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), {})


@pytest.mark.parametrize("engine", ENGINES)
def test_a_hub_model_is_prepared_once_and_training_never_reaches_the_hub(
    cluster: Cluster,
    mlflow_server: MlflowServer,
    hub: HubStandIn,
    ns: str,
    hub_operator: OperatorProcess,
    engine: str,
) -> None:
    """Download, check, tokenize and estimate once, on CPU, before any GPU pod; the report in the
    status; the trainer (first start, and its restart after the pod was deleted) and the
    registration read from the volume offline: not one request to the Hub after preparation."""
    with explained(cluster, ns, engine):
        prepared_once(cluster, mlflow_server, hub, ns, engine)


def prepared_once(
    cluster: Cluster, mlflow_server: MlflowServer, hub: HubStandIn, ns: str, engine: str
) -> None:
    name = "hub"
    doc = hub_job(name, ns, **on(engine), **{"storage.keepOnDelete": True})
    doc["spec"]["training"].update(maxSteps=30, saveSteps=5, evalSteps=10)
    apply_job(cluster, doc)

    prep = wait_for(
        lambda: (get(cluster, "job", ns, f"{name}-prepare") or {}).get("status", {}).get("succeeded") and
        get(cluster, "job", ns, f"{name}-prepare"), 300, "the preparation Job to succeed", cluster)  # fmt: skip
    after_preparation = hub.request_count()
    assert after_preparation > 0, "preparation downloaded nothing from the Hub stand-in"
    child = wait_for(
        lambda: get(cluster, CHILD_KINDS[engine], ns, f"{name}-train"), 120, f"the {engine}", cluster
    )
    # nothing GPU-sized before the preparation finished
    assert child["metadata"]["creationTimestamp"] >= prep["status"]["completionTime"]
    status = job_status(cluster, ns, name)
    report = status["preparation"]
    assert report["modelRevision"] == hub.sha(MODEL_REPO)
    assert report["datasetRevision"] == hub.sha(DATA_REPO)
    rows = sum(1 for line in (hub.folder(DATA_REPO) / "train.jsonl").read_text().splitlines() if line.strip())
    assert report["data"]["trainExamples"] + report["data"]["evalExamples"] == rows
    assert report["data"]["tokens"] > 0
    assert condition(status, "Prepared")["status"] == "True"

    # a restart of the training pod: deleted once its first checkpoint exists, made again by the
    # engine, resumed from the checkpoint, with the model and data from the volume
    folder = checkpoint_folder(cluster, ns, f"{name}-ckpt")
    wait_for(lambda: list((folder / "checkpoints").glob("checkpoint-*/COMPLETE")), TRAIN_TIMEOUT,
             "a first checkpoint", cluster)  # fmt: skip
    first = first_node_pod(cluster, ns, name, engine)
    assert first is not None
    first_uid = first["metadata"]["uid"]
    cluster.kubectl("-n", ns, "delete", "pod", first["metadata"]["name"], "--wait=false")
    new = wait_for(lambda: (p := first_node_pod(cluster, ns, name, engine)) and p["metadata"]["uid"] != first_uid and p,
                   180, f"the {engine}'s new pod", cluster)  # fmt: skip
    status = wait_phase(cluster, ns, name, "Succeeded")
    assert cluster.runner is not None
    assert "resuming from" in cluster.runner.log_of(ns, new["metadata"]["name"], last=True)
    assert hub.request_count() == after_preparation, hub.requests_since(after_preparation)
    # lineage: the resolved revisions on the registered version
    model = f"{ns}-{name}"
    (version,) = versions(mlflow_server, model)
    assert version.tags.get("kubetune.base_model.commit") == hub.sha(MODEL_REPO)
    assert version.tags.get("kubetune.dataset.commit") == hub.sha(DATA_REPO)
    assert version.tags.get("kubetune.tokenized.hash") == report["tokenizedHash"]
    assert version.tags.get("kubetune.trainer_image") == "ghcr.io/kubetune/trainer:test"
    assert version.tags.get("kubetune.version.torch")
    events = json.loads(cluster.kubectl("-n", ns, "get", "events", "-o", "json").stdout)["items"]
    assert any(e["reason"] == "Prepared" for e in events)


BAD = {
    "empty": ("empty.jsonl", ""),
    "columns": ("columns.jsonl", '{"question": "hi", "answer": "hello"}\n' * 20),
    "no-assistant": (
        "no-assistant.jsonl",
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]}\n' * 20,
    ),
    "long": ("long.jsonl", json.dumps({"messages": [
        {"role": "user", "content": "tell me " * 300}, {"role": "assistant", "content": "ok " * 300}]}) + "\n" * 1),
}  # fmt: skip


@pytest.fixture(scope="module")
def bad_inputs(cluster: Cluster, tiny_image: Path) -> Path:
    """Bad data and a model without a chat template, where the trainer image's files are."""
    root = cluster.image_files[TESTDATA_DIR]
    for file, text in BAD.values():
        (root / file).write_text(text * (20 if file == "long.jsonl" else 1))
    no_template = root / "no-template"
    shutil.copytree(tiny_image / "model", no_template, dirs_exist_ok=True)
    config = json.loads((no_template / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (no_template / "tokenizer_config.json").write_text(json.dumps(config))
    for extra in no_template.glob("chat_template.*"):
        extra.unlink()
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o055)
    return root


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_inputs_are_refused_by_name_before_any_gpu_pod(
    cluster: Cluster, hub: HubStandIn, bad_inputs: Path, ns: str, hub_operator: OperatorProcess, engine: str
) -> None:
    """Each refusal from a real bad data set or model, through the real Job controller: the job ends
    Failed with the reason and its remedy, and no training child (PyTorchJob, or TrainJob and its
    TrainingRuntime) was ever created."""
    data = f"{TESTDATA_DIR}"
    cases: dict[str, tuple[dict[str, Any], Refusal]] = {
        "empty": ({"dataset.path": f"{data}/empty.jsonl"}, Refusal.DATASET_EMPTY),
        "columns": ({"dataset.path": f"{data}/columns.jsonl"}, Refusal.DATASET_SCHEMA),
        "no-assistant": (
            {"dataset.path": f"{data}/no-assistant.jsonl", "training.assistantOnlyLoss": True},
            Refusal.NO_ASSISTANT_TURNS,
        ),
        "long": ({"dataset.path": f"{data}/long.jsonl", "training.maxLength": 64}, Refusal.MOSTLY_TRUNCATED),
        "no-template": ({"model.path": f"{data}/no-template"}, Refusal.CHAT_TEMPLATE_MISSING),
        "gated": ({}, Refusal.MODEL_GATED),
        "missing": ({}, Refusal.MODEL_NOT_FOUND),
    }  # fmt: skip
    for case, (spec, _) in cases.items():
        doc = tiny_job(case, ns, **on(engine), **spec)
        doc["spec"]["dataset"].pop("evalFraction", None)
        doc["spec"]["training"].pop("evalSteps", None)
        if case == "gated":
            doc["spec"]["model"] = {"name": GATED_REPO}
        elif case == "missing":
            doc["spec"]["model"] = {"name": "kubetune/no-such-model"}
        apply_job(cluster, doc)
    for case, (_, reason) in cases.items():
        status = wait_phase(cluster, ns, case, "Failed", timeout=300)
        ready, prepared = condition(status, "Ready"), condition(status, "Prepared")
        assert ready["reason"] == prepared["reason"] == reason.value, (case, status)
        assert HINTS[reason] in ready["message"], (case, ready["message"])
        assert get(cluster, CHILD_KINDS[engine], ns, f"{case}-train") is None, case
        assert get(cluster, "trainingruntime", ns, f"{case}-train") is None, case
    gated = condition(job_status(cluster, ns, "gated"), "Ready")["message"]
    assert "spec.secrets.huggingFaceToken" in gated and GATED_TOKEN not in gated
    # the refusal failed the Job at once (pod failure policy): one pod, no retries
    prep = get(cluster, "job", ns, "empty-prepare")
    assert prep["status"].get("failed") == 1
    assert any(
        c["type"] == "Failed" and c["reason"] == "PodFailurePolicy" for c in prep["status"]["conditions"]
    )
