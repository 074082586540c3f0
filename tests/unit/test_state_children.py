"""The ensure steps' decisions, against an in-memory API: ownership, conflicts, suspend hand-over."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from tests.support.state_obs import registration_retry, registration_turned_on

from kubetune_api.spec import FineTuneJob
from kubetune_api.trainer_config import load_manifest
from kubetune_operator import builders
from kubetune_operator.children import ensure, is_ours, sync_suspend
from kubetune_operator.kube import ApiError
from kubetune_operator.settings import Settings

REPO = Path(__file__).resolve().parents[2]
UID = "11111111-2222-3333-4444-555555555555"
T0 = "2026-12-01T00:00:00Z"


class MemoryKube:
    """Just enough of ``kube.Kube`` for the ensure steps."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.patches: list[dict[str, Any]] = []
        self.creates = 0

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind, name))
        return copy.deepcopy(obj) if obj else None

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        key = (manifest["kind"], manifest["metadata"]["name"])
        if key in self.objects:
            raise ApiError(409, "Conflict", "AlreadyExists")
        self.creates += 1
        self.objects[key] = copy.deepcopy(manifest)
        return copy.deepcopy(manifest)

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, uid: str) -> bool:
        obj = self.objects.get((kind, name))
        if obj is None or obj["metadata"].get("uid") != uid:
            return False
        del self.objects[(kind, name)]
        return True

    def patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        self.patches.append(patch)
        obj = self.objects[(kind, name)]
        _merge(obj, patch)
        return copy.deepcopy(obj)


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict):
            _merge(target.setdefault(k, {}), v)
        else:
            target[k] = v


def job(**spec: Any) -> FineTuneJob:
    j = load_manifest(REPO / "examples" / "qwen3-4b-full.yaml")
    j.metadata.uid = UID
    for k, v in spec.items():
        setattr(j.spec, k, v)
    return j


def test_ensure_creates_once_and_adopts_its_own() -> None:
    kube: Any = MemoryKube()
    manifest = builders.build_config_map(job(), Settings())
    first = ensure(kube, manifest, job())
    again = ensure(kube, manifest, job())
    assert first.created and not first.conflict
    assert not again.created and not again.conflict
    assert kube.creates == 1


def test_ensure_reports_a_stranger_and_leaves_it() -> None:
    kube: Any = MemoryKube()
    stranger = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "qwen3-4b-assistant-config"},
        "data": {},
    }
    kube.objects[("ConfigMap", "qwen3-4b-assistant-config")] = stranger
    result = ensure(kube, builders.build_config_map(job(), Settings()), job())
    assert result.conflict is not None
    assert "no owner" in result.conflict
    assert kube.objects[("ConfigMap", "qwen3-4b-assistant-config")] == stranger
    assert kube.patches == []


def test_kept_pvc_is_recognised_by_its_uid_label() -> None:
    kept = job()
    kept.spec.storage.keep_on_delete = True
    pvc = builders.build_pvc(kept, Settings())
    assert pvc is not None
    assert is_ours(pvc, kept)
    other = job()
    other.metadata.uid = "another-uid"
    assert not is_ours(pvc, other)  # a kept PVC from an earlier job of the same name is not ours


def test_suspend_and_resume_what_we_suspended() -> None:
    kube: Any = MemoryKube()
    ptj = kube.create(builders.build_pytorchjob(job(), Settings()))
    ptj = sync_suspend(kube, ptj, job(suspend=True))
    assert ptj["spec"]["runPolicy"]["suspend"] is True
    assert ptj["metadata"]["annotations"][builders.ANNOTATION_SUSPENDED_BY_US] == "true"
    assert sync_suspend(kube, ptj, job(suspend=True)) == ptj
    assert len(kube.patches) == 1
    ptj = sync_suspend(kube, ptj, job(suspend=False))
    assert ptj["spec"]["runPolicy"]["suspend"] is False
    assert builders.ANNOTATION_SUSPENDED_BY_US not in ptj["metadata"]["annotations"]


def test_a_job_kueue_holds_back_is_left_to_kueue() -> None:
    kube: Any = MemoryKube()
    manifest = builders.build_pytorchjob(job(), Settings())
    manifest["spec"]["runPolicy"]["suspend"] = True  # what Kueue's webhook does to a queued job
    ptj = kube.create(manifest)
    assert sync_suspend(kube, ptj, job(suspend=False)) == ptj
    assert kube.patches == []


def _failed_status(reason: str) -> Any:
    from kubetune_api.status import FineTuneJobStatus

    return FineTuneJobStatus.model_validate(
        {
            "phase": "Failed",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": reason,
                    "lastTransitionTime": "2026-12-01T00:00:00Z",
                }
            ],
        }
    )


def test_a_failed_registration_is_retried_only_when_the_annotation_asks() -> None:
    import yaml

    from kubetune_api.spec import RETRY_REGISTRATION_ANNOTATION as RETRY
    from kubetune_operator.reconcile import Context
    from kubetune_operator.state import Reregister

    obj = yaml.safe_load((REPO / "examples" / "qwen3-4b-full.yaml").read_text())
    obj["metadata"].update(uid=UID, namespace="ml")
    kube = MemoryKube()
    ctx = Context(kube=kube, settings=Settings(), emit=lambda *_: None)  # type: ignore[arg-type]
    failed = _failed_status("RegistrationFailed")
    reg = f"{obj['metadata']['name']}-register"
    ptj = f"{obj['metadata']['name']}-train"
    ours = {"metadata": {"name": reg, "uid": "j1", "labels": {"kubetune.io/job-uid": UID}}}
    ours["metadata"]["ownerReferences"] = [
        {"uid": UID, "kind": "FineTuneJob", "name": obj["metadata"]["name"]}
    ]

    obj["metadata"]["annotations"] = {RETRY: "1"}
    assert registration_retry(ctx, obj, failed) is None  # no PyTorchJob: a retry would train again
    kube.objects[("PyTorchJob", ptj)] = {
        "metadata": {"name": ptj},
        "status": {"conditions": [{"type": "Succeeded", "status": "True"}]},
    }
    assert registration_retry(ctx, obj, failed) == Reregister.RETRY  # asked, the failed Job gone
    assert registration_retry(ctx, obj, _failed_status("TrainingFailed")) is None  # training failed: final
    # the same value again (acted on already), or none: the failed Job's absence alone is no request
    assert registration_retry(ctx, obj, failed.model_copy(update={"registration_retry": "1"})) is None
    obj["metadata"]["annotations"] = {}
    assert registration_retry(ctx, obj, failed) is None

    kube.objects[("Job", reg)] = {**ours, "status": {}}
    # a Job that has not failed: a retry whose status write lost a race, followed to its end
    assert registration_retry(ctx, obj, failed) == Reregister.FOLLOW
    kube.objects[("Job", reg)]["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    assert registration_retry(ctx, obj, failed) is None  # still the failed one, nobody asked: Failed
    kube.objects[("Job", reg)]["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    obj["metadata"]["annotations"] = {RETRY: "2"}
    assert registration_retry(ctx, obj, failed) is None  # being deleted: its deletion is the next event
    assert ("Job", reg) in kube.objects
    del kube.objects[("Job", reg)]["metadata"]["deletionTimestamp"]
    # asked while the failed Job is there: the operator deletes that Job (by uid); its deletion's
    # pass goes on
    assert registration_retry(ctx, obj, failed) is None and ("Job", reg) not in kube.objects
    assert registration_retry(ctx, obj, failed) == Reregister.RETRY
    # a stranger's Job of that name is never deleted
    kube.objects[("Job", reg)] = {
        "metadata": {"name": reg, "uid": "x"},
        "status": {"conditions": [{"type": "Failed", "status": "True"}]},
    }
    assert registration_retry(ctx, obj, failed) is None and ("Job", reg) in kube.objects
    del kube.objects[("Job", reg)]
    obj["spec"]["registration"] = {**obj["spec"].get("registration", {}), "enabled": False}
    # turned off, then asked: the job finishes without registering (no new Job)
    assert registration_retry(ctx, obj, failed) == Reregister.RETRY_DISABLED


def test_registration_turned_on_after_a_run_without_it() -> None:
    import yaml

    from kubetune_api.status import FineTuneJobStatus
    from kubetune_operator.reconcile import Context
    from kubetune_operator.state import Reregister

    obj = yaml.safe_load((REPO / "examples" / "qwen3-4b-full.yaml").read_text())
    obj["metadata"].update(uid=UID, namespace="ml")
    kube = MemoryKube()
    ctx = Context(kube=kube, settings=Settings(), emit=lambda *_: None)  # type: ignore[arg-type]
    ptj = f"{obj['metadata']['name']}-train"

    def succeeded(reason: str, model: bool = False) -> Any:
        status: dict[str, Any] = {
            "phase": "Succeeded",
            "conditions": [
                {
                    "type": "Registered",
                    "status": str(reason == "ModelRegistered"),
                    "reason": reason,
                    "lastTransitionTime": "2026-12-01T00:00:00Z",
                }
            ],
        }
        if model:
            status["registeredModel"] = {"name": "m", "version": "1", "uri": "models:/m/1"}
        return FineTuneJobStatus.model_validate(status)

    off = succeeded("RegistrationDisabled")
    assert registration_turned_on(ctx, obj, off) is None  # no PyTorchJob: registering would train again
    kube.objects[("PyTorchJob", ptj)] = {
        "metadata": {"name": ptj},
        "status": {"conditions": [{"type": "Succeeded", "status": "True"}]},
    }
    assert registration_turned_on(ctx, obj, off) == Reregister.ENABLED
    # registered already: a model in the status, or a Registered condition that is not "disabled"
    assert registration_turned_on(ctx, obj, succeeded("RegistrationDisabled", model=True)) is None
    assert registration_turned_on(ctx, obj, succeeded("ModelRegistered")) is None
    obj["spec"]["registration"] = {**obj["spec"].get("registration", {}), "enabled": False}
    assert registration_turned_on(ctx, obj, off) is None  # still off


def test_training_the_status_records_as_finished_needs_no_pytorchjob() -> None:
    import yaml

    from kubetune_api.status import FineTuneJobStatus
    from kubetune_operator.reconcile import Context
    from kubetune_operator.state import Reregister

    obj = yaml.safe_load((REPO / "examples" / "qwen3-4b-full.yaml").read_text())
    obj["metadata"].update(uid=UID, namespace="ml")
    ctx = Context(kube=MemoryKube(), settings=Settings(), emit=lambda *_: None)  # type: ignore[arg-type]
    trained = {"type": "Training", "status": "False", "reason": "TrainingSucceeded", "lastTransitionTime": T0}

    def status(phase: str, condition: dict[str, str]) -> Any:
        return FineTuneJobStatus.model_validate({"phase": phase, "conditions": [trained, condition]})

    failed = status(
        "Failed",
        {"type": "Ready", "status": "False", "reason": "RegistrationFailed", "lastTransitionTime": T0},
    )
    off = status(
        "Succeeded",
        {"type": "Registered", "status": "False", "reason": "RegistrationDisabled", "lastTransitionTime": T0},
    )
    # no PyTorchJob at all (deleted after it succeeded): both still register, since no pass re-creates it
    from kubetune_api.spec import RETRY_REGISTRATION_ANNOTATION

    obj["metadata"]["annotations"] = {RETRY_REGISTRATION_ANNOTATION: "t1"}
    assert registration_retry(ctx, obj, failed) == Reregister.RETRY
    assert registration_turned_on(ctx, obj, off) == Reregister.ENABLED
