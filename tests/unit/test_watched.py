"""The preparation Jobs and pods as their watch events showed them (kubetune_operator.watched): a
pass takes them only when the events showed the Job it means and at least one of its pods, and a
deleted pod or Job is gone from them."""

from __future__ import annotations

from typing import Any

from kubetune_operator.watched import Preparations


def job(uid: str = "job-uid", name: str = "j-prepare", complete: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Complete", "status": "True"}] if complete else []
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "labels": {"kubetune.io/job": "j"}},
        "spec": {"template": {"spec": {"containers": [{"name": "prepare"}]}}},
        "status": {"conditions": conditions},
    }


def pod(uid: str, owner: str = "job-uid") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{uid}", "uid": uid, "ownerReferences": [{"uid": owner}]},
        "spec": {"containers": [{"name": "prepare"}]},
        "status": {"phase": "Running"},
    }


def test_a_pass_reads_them_until_the_events_showed_the_job_and_one_of_its_pods() -> None:
    seen = Preparations()
    assert seen.get("ns", "j", "j-prepare") is None
    seen.saw("ns", "j", job(), deleted=False)
    assert seen.get("ns", "j", "j-prepare") is None  # no pod of it seen yet
    seen.saw("ns", "j", pod("other", owner="an-older-job"), deleted=False)
    assert seen.get("ns", "j", "j-prepare") is None  # a pod of another Job of that name
    seen.saw("ns", "j", pod("p1"), deleted=False)
    got = seen.get("ns", "j", "j-prepare")
    assert got is not None
    found_job, pods = got
    assert [p["metadata"]["uid"] for p in pods] == ["p1"]
    assert "spec" not in found_job and "spec" not in pods[0]  # only what a pass reads is kept
    assert seen.get("ns", "j", "another-name") is None


def test_the_newest_event_wins_and_a_deleted_pod_or_job_is_gone() -> None:
    seen = Preparations()
    seen.saw("ns", "j", job(), deleted=False)
    seen.saw("ns", "j", pod("p1"), deleted=False)
    seen.saw("ns", "j", job(complete=True), deleted=False)
    got = seen.get("ns", "j", "j-prepare")
    assert got is not None and got[0]["status"]["conditions"][0]["type"] == "Complete"
    seen.saw("ns", "j", pod("p1"), deleted=True)
    assert seen.get("ns", "j", "j-prepare") is None
    seen.saw("ns", "j", pod("p2"), deleted=False)
    seen.saw("ns", "j", job(), deleted=True)
    assert seen.get("ns", "j", "j-prepare") is None
    seen.saw("ns", "j", job(), deleted=False)
    seen.forget("ns", "j")
    assert seen.get("ns", "j", "j-prepare") is None
