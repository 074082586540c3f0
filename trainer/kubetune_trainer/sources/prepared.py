"""What the preparation step leaves on the checkpoint volume, read back: the manifest, the key of
the tokenized data, the hashes it is checked by, and :func:`prepared` (the model and tokenized data
for a config, or None: load and tokenize as without preparation).

The preparation step (:mod:`kubetune_trainer.preparation.prepare`) writes this layout; training
loads from it (:mod:`kubetune_trainer.training.build`). The layout's names are the contract of
:mod:`kubetune_api.preparation`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubetune_api.preparation import DATA_DIR, MANIFEST_FILE, MODEL_DIR
from kubetune_api.trainer_config import TrainerConfig

from . import chain
from .chat import CHATML_TEMPLATE
from .data_check import BadInputError, DataCheck, splits_of
from .layout import layout_of

# Bump when the tokenized layout or its meaning changes: older prepared data is then not reused.
LAYOUT_VERSION = 1
DATASET_SOURCE_DIR = "prepared/dataset"  # a Hub data set's files at the resolved commit
# The files that decide how text becomes tokens (their hashes are part of the key).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
_CHUNK = 4 << 20


@dataclass(frozen=True)
class Prepared:
    """What the trainer loads instead of downloading and tokenizing."""

    model_dir: Path | None  # the downloaded Hub model (None: the spec's path is read as it is)
    train_dir: Path
    eval_dir: Path | None
    key: str
    format: str
    data_hash: str | None
    dataset_revision: str | None


# --- hashes and the key -----------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tokenizer_hash(model_dir: Path) -> str:
    """A hash of the files that decide the tokens, and of the ChatML template kubetune adds to a
    tokenizer without one."""
    digest = hashlib.sha256(CHATML_TEMPLATE.encode())
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + file_sha256(path).encode())
    return digest.hexdigest()[:16]


def tokenization_key(cfg: TrainerConfig, tok_hash: str, data_hash: str | None, fmt: str) -> str:
    """Everything that changes the tokenized data: a changed spec never reuses stale tokens, an
    unchanged one (another learning rate, more steps) reuses them."""
    src, t = cfg.spec.dataset, cfg.spec.training
    parts = {
        "layout": LAYOUT_VERSION,
        "tokenizer": tok_hash,
        "data": data_hash or f"{src.name}@{src.revision}",
        "subset": src.subset,
        "split": src.split,
        "evalSplit": src.eval_split,
        "evalFraction": src.eval_fraction,
        "seed": src.seed,
        "format": fmt,
        "assistantOnlyLoss": t.assistant_only_loss,
    }
    conversion = layout_of(src).identity()
    if conversion is not None:  # only when rows are converted: the keys of native data stay as they were
        parts["conversion"] = conversion
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def data_files_entry(cfg: TrainerConfig, root: Path) -> dict[str, Any]:
    """The data's files (a local path, or the Hub data set's downloaded files) with size and sha256."""
    src = cfg.spec.dataset
    where = Path(src.path) if src.path else root / DATASET_SOURCE_DIR / (src.subset or "")
    try:
        files = [f for fs in splits_of(where).values() for f in fs]
    except BadInputError:
        return {}
    base = where if where.is_dir() else where.parent
    return {
        str(f.relative_to(base)): {"size": f.stat().st_size, "sha256": file_sha256(f)} for f in sorted(files)
    }


def folder_hash(folder: Path) -> str:
    """A content hash of a saved data set folder (file names and contents)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + file_sha256(path).encode())
    return digest.hexdigest()[:16]


# --- the manifest -----------------------------------------------------------------------------------


def read_manifest(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((root / MANIFEST_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def prepared(cfg: TrainerConfig, root: Path | None = None) -> Prepared | None:
    """The prepared model and data for this config, when the volume holds them (a manifest whose
    key matches this spec, and its tokenized data); None: load and tokenize as without preparation."""
    root = Path(root or cfg.output_dir)
    manifest = read_manifest(root)
    data = manifest.get("data") or {}
    model = manifest.get("model") or {}
    src, dataset = cfg.spec.model, cfg.spec.dataset
    if not data.get("key") or not data.get("tokenizerHash"):
        return None
    if data.get("source") != (dataset.name or dataset.path):
        return None  # prepared from other data
    tok_hash = _prepared_tokenizer(cfg, root, model, data["tokenizerHash"])
    if tok_hash is None:
        return None
    key = tokenization_key(cfg, tok_hash, data.get("dataHash"), data.get("format", ""))
    folder = root / DATA_DIR / key
    if key != data["key"] or not (folder / "COMPLETE").is_file():
        return None
    model_dir = None if src.path or chain.is_chained(cfg) else root / MODEL_DIR
    return Prepared(
        model_dir=model_dir,
        train_dir=folder / "train",
        eval_dir=folder / "eval" if (folder / "eval").is_dir() else None,
        key=key,
        format=data["format"],
        data_hash=data.get("dataHash"),
        dataset_revision=data.get("revision"),
    )


def _prepared_tokenizer(cfg: TrainerConfig, root: Path, model: dict[str, Any], recorded: str) -> str | None:
    """The hash of the tokenizer the prepared data was made with, when the manifest's model is this
    config's model (None: it is not)."""
    src = cfg.spec.model
    if chain.is_chained(cfg):  # the starting model recorded for this parent or version
        start = chain.read_start(cfg, root)
        if start is None or model.get("start") != start.source:
            return None
        return tokenizer_hash(start.folder)
    if src.path:  # read where it is: its tokenizer now, not as it was
        if model.get("path") != str(Path(src.path)) or not Path(src.path).is_dir():
            return None
        return tokenizer_hash(Path(src.path))
    if not model.get("downloaded") or model.get("name") != src.name:
        return None
    return recorded


def prepared_check(found: Prepared) -> DataCheck:
    """The data check's result as preparation recorded it (the trainer needs no network for it)."""
    return DataCheck(format=found.format, data_hash=found.data_hash, revision=found.dataset_revision)
