"""The preparation step against the Hub's download protocol (the stand-in of tests/support/hub.py):
resolved commits, one download, refusals from the Hub's own answers (401 gated, 404 missing), and a
trainer that afterwards makes not one request.

The processes run as they do in a pod: ``python -m kubetune_trainer.prepare`` and ``.train`` with
``HF_ENDPOINT`` in their environment (``huggingface_hub`` reads it when imported) and their own
``HF_HOME``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import REPO, TINY_DATA, run_trainer, trainer_config, trainer_env
from tests.support.hub import HubStandIn

from kubetune_api.preparation import PreparationRefusal, PreparationReport, Refusal, parse_termination_message
from kubetune_api.trainer_config import TrainerConfig

pytestmark = [pytest.mark.e2e, pytest.mark.training]

MODEL, DATA, GATED = "kubetune/tiny", "kubetune/tiny-chat", "kubetune/tiny-gated"
TOKEN = "hf_test_token_not_a_secret"


@pytest.fixture(scope="module")
def hub(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandIn]:
    data = tmp_path_factory.mktemp("hub-data")
    (data / "data").mkdir()
    shutil.copy(TINY_DATA, data / "data" / "train-00000-of-00001.jsonl")
    server = HubStandIn(tmp_path_factory.mktemp("hub"))
    server.add_model(MODEL, tiny_model)
    server.add_model(GATED, tiny_model, gated_token=TOKEN)
    server.add_dataset(DATA, data)
    yield server
    server.stop()


def hub_config(out: Path, tiny_model: Path, model: str = MODEL, dataset: str = DATA, **training: Any) -> Path:
    config = trainer_config(
        out, tiny_model, dataset={"name": dataset, "format": "messages", "evalFraction": 0.1}, **training
    )
    cfg = TrainerConfig.load(config)
    spec = cfg.spec.model_copy(
        update={"model": cfg.spec.model.model_copy(update={"name": model, "path": None})}
    )
    config.write_text(cfg.model_copy(update={"spec": spec}).to_yaml())
    return config


def prepare(config: Path, hub: HubStandIn, home: Path, **env: str) -> tuple[int, Any, str]:
    term = config.with_suffix(".termination-log")
    full = {
        **trainer_env(),
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(home),
        **env,
    }
    if "HF_TOKEN" not in env:
        full.pop("HF_TOKEN", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubetune_trainer.prepare",
            "--config",
            str(config),
            "--termination-log",
            str(term),
        ],
        cwd=REPO,
        env=full,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    outcome = parse_termination_message(term.read_text() if term.exists() else "")
    return proc.returncode, outcome, proc.stderr


def test_downloaded_once_and_the_trainer_never_asks_the_hub(
    tmp_path: Path, tiny_model: Path, hub: HubStandIn
) -> None:
    config = hub_config(tmp_path / "out", tiny_model, maxSteps=4, saveSteps=2)
    before = hub.request_count()
    code, report, err = prepare(config, hub, tmp_path / "home")
    assert code == 0, err
    assert isinstance(report, PreparationReport)
    assert report.model_revision == hub.sha(MODEL) and report.dataset_revision == hub.sha(DATA)
    assert report.data.train_examples + report.data.eval_examples == len(TINY_DATA.read_text().splitlines())
    downloads = [r for r in hub.requests_since(before) if r[0] == "GET" and "/resolve/" in r[1]]
    assert any("model.safetensors" in path for _, path in downloads)
    assert (tmp_path / "out" / "prepared" / "model" / "config.json").is_file()

    # again (a retried preparation): the model is verified on the volume, not downloaded again
    before = hub.request_count()
    code, again, err = prepare(config, hub, tmp_path / "home2")
    assert code == 0, err
    assert isinstance(again, PreparationReport) and again.reused
    assert not [p for m, p in hub.requests_since(before) if m == "GET" and "model.safetensors" in p]

    # the trainer, offline as in its pod, then restarted: not one request
    before = hub.request_count()
    offline = {
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(tmp_path / "home3"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    assert run_trainer(config, tmp_path / "train.log", extra_env={**offline}) == 0, (
        tmp_path / "train.log"
    ).read_text()[-3000:]
    result = json.loads((tmp_path / "out" / "train-result.json").read_text())
    assert result["global_step"] == 4
    assert hub.requests_since(before) == []


@pytest.mark.parametrize(
    ("model", "dataset", "env", "reason"),
    [
        (GATED, DATA, {}, Refusal.MODEL_GATED),
        (GATED, DATA, {"HF_TOKEN": "hf_wrong"}, Refusal.MODEL_GATED),
        ("kubetune/no-such-model", DATA, {}, Refusal.MODEL_NOT_FOUND),
        (MODEL, "kubetune/no-such-data", {}, Refusal.DATASET_NOT_FOUND),
    ],
    ids=["gated-no-token", "gated-wrong-token", "missing-model", "missing-data"],
)
def test_the_hubs_refusals_by_name(
    tmp_path: Path,
    tiny_model: Path,
    hub: HubStandIn,
    model: str,
    dataset: str,
    env: dict[str, str],
    reason: Refusal,
) -> None:
    config = hub_config(tmp_path / "out", tiny_model, model=model, dataset=dataset)
    code, refusal, err = prepare(config, hub, tmp_path / "home", **env)
    assert code == 2, err
    assert isinstance(refusal, PreparationRefusal) and refusal.reason == reason, (refusal, err[-2000:])
    assert "Traceback" not in err
    if reason == Refusal.MODEL_GATED:
        assert "spec.secrets.huggingFaceToken" in refusal.message + refusal.hint
        assert "hf_wrong" not in refusal.message and "hf_wrong" not in err


def test_a_gated_model_with_its_token_is_prepared(tmp_path: Path, tiny_model: Path, hub: HubStandIn) -> None:
    config = hub_config(tmp_path / "out", tiny_model, model=GATED)
    code, report, err = prepare(config, hub, tmp_path / "home", HF_TOKEN=TOKEN)
    assert code == 0, err
    assert isinstance(report, PreparationReport) and report.model_revision == hub.sha(GATED)
    assert TOKEN not in err and TOKEN not in json.dumps(report.wire())
    assert TOKEN not in (tmp_path / "out" / "prepared" / "manifest.json").read_text()


def _data_repo(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def _with_subset(config: Path, subset: str) -> Path:
    cfg = TrainerConfig.load(config)
    dataset = cfg.spec.dataset.model_copy(update={"subset": subset})
    config.write_text(
        cfg.model_copy(update={"spec": cfg.spec.model_copy(update={"dataset": dataset})}).to_yaml()
    )
    return config


def test_a_new_commit_of_the_data_set_leaves_no_stale_file_and_subsets_are_found(
    tmp_path: Path, tiny_model: Path, hub: HubStandIn
) -> None:
    """A branch that moved to a commit whose shard has another name (as a re-upload names it): the
    preparation reads the new commit's files only, not both. A subset in data/<subset>/ beside a
    root dataset_infos.json (a common Hub layout) is found, and the metadata is not read as data."""
    rows = TINY_DATA.read_text()
    count = len(rows.splitlines())
    name = "kubetune/moving"
    hub.add_dataset(name, _data_repo(tmp_path / "c1", {"data/train-00000-of-00001.jsonl": rows}))
    config = hub_config(tmp_path / "out", tiny_model, dataset=name)
    code, first, err = prepare(config, hub, tmp_path / "home")
    assert code == 0 and isinstance(first, PreparationReport), err
    hub.add_dataset(name, _data_repo(tmp_path / "c2", {"data/train.jsonl": rows}))
    code, second, err = prepare(config, hub, tmp_path / "home")
    assert code == 0 and isinstance(second, PreparationReport), err
    assert second.dataset_revision == hub.sha(name) != first.dataset_revision
    assert second.data.train_examples + second.data.eval_examples == count  # not twice
    held = sorted(p.name for p in (tmp_path / "out" / "prepared" / "dataset").rglob("*.jsonl"))
    assert held == ["train.jsonl"]

    layout = {"data/all/train-00000-of-00001.jsonl": rows, "dataset_infos.json": '{"all": {}}'}
    hub.add_dataset("kubetune/subsets", _data_repo(tmp_path / "c3", layout))
    config = _with_subset(hub_config(tmp_path / "sub", tiny_model, dataset="kubetune/subsets"), "all")
    code, report, err = prepare(config, hub, tmp_path / "home")
    assert code == 0 and isinstance(report, PreparationReport), err
    assert report.data.train_examples + report.data.eval_examples == count


def test_a_model_file_changed_on_the_volume_is_downloaded_again(
    tmp_path: Path, tiny_model: Path, hub: HubStandIn
) -> None:
    """A bad block in the weights, the size and modification time kept (a restored backup): the
    preparation finds it by its hash and downloads the file again instead of trusting the Hub
    client's own records."""
    config = hub_config(tmp_path / "out", tiny_model)
    code, _, err = prepare(config, hub, tmp_path / "home")
    assert code == 0, err
    weights = tmp_path / "out" / "prepared" / "model" / "model.safetensors"
    good, stat = weights.read_bytes(), weights.stat()
    weights.write_bytes(good[:-100] + b"\0" * 100)
    import os

    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    before = hub.request_count()
    code, _, err = prepare(config, hub, tmp_path / "home")
    assert code == 0, err
    assert any("model.safetensors" in p for m, p in hub.requests_since(before) if m == "GET")
    assert weights.read_bytes() == good
