"""The training data as the spec names it: a local file or folder (JSON lines, a JSON array,
Parquet) or a Hub data set, loaded into its splits (train, eval split or eval fraction) with only
its format's columns, after the row-by-row check of :mod:`.data_check`.

A new kind of data source goes here (how its splits are loaded) and into :mod:`.data_check` (how its
rows are read and checked before anything is loaded); the preparation step
(:mod:`kubetune_trainer.preparation.prepare`) downloads a remote source's files once and hands the
trainer a local copy, so both read it through these functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubetune_api.spec import DatasetFormat, DatasetSource
from kubetune_api.trainer_config import TrainerConfig

from .. import settings
from . import data_check, preference
from .data_check import COLUMNS, DataCheck, DataError
from .data_check import data_files as _data_files
from .layout import LayoutError, convert_dataset, layout_of


def load_splits(src: DatasetSource, *, revision: str | None = None) -> tuple[Any, Any]:
    """(train, eval or None) as the spec says: a split, an eval split, or an eval fraction.

    ``revision``: the Hub commit the data check resolved (what is hashed is what trains).
    """
    from datasets import load_dataset

    if src.path:
        builder, files = _data_files(Path(src.path))
        try:
            data = load_dataset(builder, data_files=files)
        except Exception as e:  # the check read every row; what is left is the library's own verdict
            cause = e.__cause__ or e
            raise DataError(
                f"{src.path}: the datasets library could not read it: {type(cause).__name__}: "
                + " ".join(str(cause).split())[:500]
            ) from e
    else:
        data = load_dataset(
            src.name, src.subset, revision=revision or src.revision, token=settings.current().hf_token
        )
    if src.split not in data:
        raise DataError(f"dataset has no split {src.split!r} (it has {sorted(data)})")
    train = data[src.split]
    evaluation = None
    if src.eval_split:
        if src.eval_split not in data:
            raise DataError(f"dataset has no eval split {src.eval_split!r} (it has {sorted(data)})")
        evaluation = data[src.eval_split]
    elif src.eval_fraction:
        # The fixed seed makes every rank and every restart hold out the same rows.
        parts = train.train_test_split(test_size=src.eval_fraction, seed=src.seed)
        train, evaluation = parts["train"], parts["test"]
    return train, evaluation


def keep_columns(dataset: Any, fmt: str) -> Any:
    """Only the columns TRL should see: extra ones confuse its format detection."""
    if dataset is None:
        return None
    wanted = set(COLUMNS[DatasetFormat(fmt)])
    extra = [c for c in dataset.column_names if c not in wanted]
    return dataset.remove_columns(extra) if extra else dataset


def check_raw_data(cfg: TrainerConfig) -> DataCheck:
    """The data pre-check of the data as it is now (never what a preparation recorded): preference
    pairs (:mod:`.preference`) for objective dpo or orpo, else SFT rows (:mod:`.data_check`)."""
    if cfg.spec.prefers and cfg.spec.dataset.path:
        return preference.check_files(cfg.spec.dataset)
    return data_check.check(
        cfg.spec.dataset,
        assistant_only_loss=cfg.spec.training.assistant_only_loss,
        token=settings.current().hf_token,
    )


def converted(src: DatasetSource, train: Any, evaluation: Any) -> tuple[Any, Any]:
    """The loaded splits in kubetune's own columns (spec.dataset.layout, columns, roles, systemPrompt):
    the one conversion (:mod:`.layout`), here for every reader of the raw data."""
    layout = layout_of(src)
    label = f"{src.name or src.path}"
    try:
        return (
            convert_dataset(layout, train, f"{label} split {src.split!r}"),
            convert_dataset(layout, evaluation, f"{label} split {src.eval_split or 'eval'!r}"),
        )
    except LayoutError as e:
        raise DataError(str(e)) from None


def raw_datasets(cfg: TrainerConfig, checked: DataCheck) -> tuple[Any, Any, str]:
    """The splits as the spec's source holds them now, in kubetune's own columns (what preparation
    tokenizes)."""
    src = cfg.spec.dataset
    if cfg.spec.prefers:  # pairs as named (the API refuses layouts and renamed columns for them)
        train, evaluation = load_splits(src, revision=checked.revision)
        if checked.format is None:
            preference.check_loaded(train, evaluation, src)
        keep = preference.keep_pair_columns
        return keep(train), keep(evaluation), preference.PAIR_FORMAT
    train, evaluation = converted(src, *load_splits(src, revision=checked.revision))
    if checked.format is not None:
        fmt = checked.format  # every row was read and checked already
    else:
        fmt = data_check.check_loaded(
            train, evaluation, src, assistant_only_loss=cfg.spec.training.assistant_only_loss
        )
    return keep_columns(train, fmt), keep_columns(evaluation, fmt), fmt
