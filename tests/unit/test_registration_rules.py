"""spec.registration values MLflow would refuse, or that would put credentials in the spec: the API
server refuses them (CEL, tests/integration/test_api_server.py); a local manifest is refused the same
way; a job the API server admitted before these rules still parses in the operator."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubetune_api.spec import parse_job
from kubetune_api.trainer_config import load_manifest

REPO = Path(__file__).resolve().parents[2]


def _manifest(tmp_path: Path, **registration: str) -> tuple[Path, dict[str, object]]:
    doc = yaml.safe_load((REPO / "examples" / "tiny-local.yaml").read_text())
    doc["spec"].setdefault("registration", {}).update(registration)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, doc


@pytest.mark.parametrize(
    ("registration", "message"),
    [
        ({"alias": "latest"}, "spec.registration.alias must not be 'latest' or v<number>"),
        ({"alias": "LATEST"}, "spec.registration.alias must not be 'latest' or v<number>"),
        ({"alias": "v3"}, "spec.registration.alias must not be 'latest' or v<number>"),
        (
            {"trackingUri": "https://bob:hunter2@mlflow.example.com"},
            "spec.registration.trackingUri must not carry credentials",
        ),
    ],
)
def test_a_local_manifest_is_refused_naming_the_field(
    tmp_path: Path, registration: dict[str, str], message: str
) -> None:
    path, doc = _manifest(tmp_path, **registration)
    with pytest.raises(ValueError, match=message) as refused:
        load_manifest(path)
    assert "hunter2" not in str(refused.value)
    # an upgraded operator keeps following a job admitted before the rules that has started...
    started = {**doc, "metadata": {**doc["metadata"], "namespace": "ml"}, "status": {"phase": "Training"}}
    assert parse_job(started).metadata.name  # type: ignore[arg-type]
    # ...and refuses one that has not, naming the field, before it creates any child
    with pytest.raises(ValueError, match=message):
        parse_job({**doc, "metadata": {**doc["metadata"], "namespace": "ml"}})  # type: ignore[dict-item]


def test_aliases_mlflow_takes_pass(tmp_path: Path) -> None:
    for alias in ("champion", "v1beta", "latest_good", "V2-rc"):
        path, _ = _manifest(tmp_path, alias=alias)
        assert load_manifest(path).spec.registration.alias == alias
