"""The provenance tags of a registered version: the preparation report's commits and hashes, the
image and the library versions; nothing when the job was not prepared, and never a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubetune_api.preparation import REPORT_FILE, DataStats, PreparationReport
from kubetune_trainer import settings
from kubetune_trainer.registration import lineage


def test_tags_from_the_report_the_image_and_the_libraries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = PreparationReport(
        model_revision="a" * 40,
        dataset_revision="b" * 40,
        dataset_hash="c" * 16,
        tokenized_key="d" * 16,
        tokenized_hash="e" * 16,
        data=DataStats(
            train_examples=1,
            tokens=10,
            length_p50=10,
            length_p95=10,
            length_max=10,
            truncated_fraction=0,
            loss_token_fraction=1,
        ),
    )
    (tmp_path / REPORT_FILE).parent.mkdir(parents=True)
    (tmp_path / REPORT_FILE).write_text(report.model_dump_json(by_alias=True))
    monkeypatch.setenv(settings.IMAGE_ENV, "ghcr.io/kubetune/trainer:1.2.3")
    tags = lineage.provenance_tags(tmp_path)
    assert tags[lineage.TAG_BASE_MODEL_COMMIT] == "a" * 40
    assert tags[lineage.TAG_DATASET_COMMIT] == "b" * 40
    assert tags[lineage.TAG_DATASET_HASH] == "c" * 16
    assert tags[lineage.TAG_TOKENIZED_KEY] == "d" * 16
    assert tags[lineage.TAG_TOKENIZED_HASH] == "e" * 16
    assert tags[lineage.TAG_IMAGE] == "ghcr.io/kubetune/trainer:1.2.3"
    import torch
    import transformers

    assert (
        tags["kubetune.version.torch"] == torch.__version__.split("+")[0]
        or tags["kubetune.version.torch"] == torch.__version__
    )
    assert tags["kubetune.version.transformers"] == transformers.__version__
    assert all(isinstance(v, str) and v for v in tags.values())


def test_no_report_no_preparation_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(settings.IMAGE_ENV, raising=False)
    tags = lineage.provenance_tags(tmp_path)
    assert lineage.TAG_BASE_MODEL_COMMIT not in tags and lineage.TAG_IMAGE not in tags
    assert "kubetune.version.peft" in tags
    (tmp_path / REPORT_FILE).parent.mkdir(parents=True)
    (tmp_path / REPORT_FILE).write_text("{not json")
    assert lineage.TAG_TOKENIZED_HASH not in lineage.provenance_tags(tmp_path)
