"""The operator's twin of the transition rules: the trainer config of a created job takes the spec's
mutable paths (suspend, registration.enabled, registration.alias) and nothing else, even when an API
server with an older CRD admitted a change of what may not change (the gate, say)."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from kubetune_api.spec import parse_job
from kubetune_api.trainer_config import CONFIG_KEY
from kubetune_operator import builders
from kubetune_operator.children import sync_config
from kubetune_operator.settings import Settings

SPEC: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen2-0.5B"},
    "dataset": {"name": "trl-lib/Capybara", "evalFraction": 0.1},
    "training": {"maxSteps": 10},
    "registration": {"modelName": "m", "alias": "first", "gate": {"maxEvalLoss": 1.5}},
}


class Recorder:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def patch(
        self, api_version: str, kind: str, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        self.patches.append(body)
        return {"metadata": {"name": name, "namespace": namespace}, **body}


def config_map(spec: dict[str, Any]) -> dict[str, Any]:
    job = parse_job({"metadata": {"name": "j", "namespace": "ml", "uid": "u"}, "spec": spec})
    return builders.build_config_map(job, Settings())


def written(kube: Recorder) -> dict[str, Any]:
    assert len(kube.patches) == 1
    spec: dict[str, Any] = yaml.safe_load(kube.patches[0]["data"][CONFIG_KEY])["spec"]
    return spec


def test_mutable_changes_reach_the_config() -> None:
    new = copy.deepcopy(SPEC)
    new["suspend"] = True
    new["registration"].update(alias="second", enabled=False)
    kube = Recorder()
    sync_config(kube, config_map(SPEC), config_map(new))  # type: ignore[arg-type]
    spec = written(kube)
    assert (spec["suspend"], spec["registration"]["alias"], spec["registration"]["enabled"]) == (
        True,
        "second",
        False,
    )


def test_an_admitted_change_of_the_gate_or_the_model_name_does_not() -> None:
    new = copy.deepcopy(SPEC)
    new["registration"].update(
        alias="second", gate={"maxEvalLoss": 99.0}, modelName="other", select="bestEval"
    )
    new["registration"].pop("alias")
    kube = Recorder()
    sync_config(kube, config_map(SPEC), config_map(new))  # type: ignore[arg-type]
    spec = written(kube)
    assert spec["registration"]["gate"] == {"maxEvalLoss": 1.5}
    assert (spec["registration"]["modelName"], spec["registration"]["select"]) == ("m", "final")
    assert "alias" not in spec["registration"]  # the alias removed: a mutable change, taken


def test_nothing_is_written_when_only_an_immutable_part_changed() -> None:
    new = copy.deepcopy(SPEC)
    new["registration"]["gate"] = None
    kube = Recorder()
    live = config_map(SPEC)
    assert sync_config(kube, live, config_map(new)) is live  # type: ignore[arg-type]
    assert kube.patches == []
