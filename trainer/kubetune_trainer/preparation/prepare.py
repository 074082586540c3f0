"""The preparation step: download once, check and tokenize the data, estimate, or refuse by name.

Run in a cluster as ``python -m kubetune_trainer.prepare --config /etc/kubetune/config.yaml`` by
the preparation Job, on CPU, before any GPU pod exists; locally by ``kubetune prepare`` and
``kubetune run --local``. What it leaves on the checkpoint volume (``cfg.output_dir``), what it
reports and why it refuses are the contract of :mod:`kubetune_api.preparation`:

1. the base model: a Hub model is resolved to its commit and downloaded (config, tokenizer,
   weights) into ``prepared/model/``, unless the manifest says that commit is there and its files
   still have the recorded sizes and hashes; a ``path`` is read where it is; a chained job's
   starting model (``fromJob``: a parent's adapter merged into its base, or its full model;
   ``registered``: the version an alias resolves to, downloaded from MLflow) is put in place by
   :mod:`.chain` (``prepared/start.json``), and its tokenizer tokenizes the data;
2. the data: read and checked row by row as the trainer reads it (:mod:`.data_check`,
   :func:`.build.build_datasets`: format detection, splits, eval fraction), then tokenized with
   TRL's own dataset preparation (chat template, assistant and completion masks, labels) and saved
   with ``save_to_disk`` under ``prepared/data/<key>/``, ``key`` a hash of everything that changes
   the tokens. The trainer hands these to TRL, which packs or truncates them as it would have
   done after its own tokenization: the same tokens and labels either way;
3. the statistics and the estimate (:mod:`.estimate`: the trainer's plan for the GPUs the job asks
   for), the manifest (``prepared/manifest.json``) and the report (``prepared/report.json``, and
   the pod's termination message for the operator).

Input the user must fix raises :class:`Refused` with a :class:`~kubetune_api.preparation.Refusal`;
the command exits ``EXIT_REFUSED`` (2) with the refusal as its termination message.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubetune_api.preparation import (
    DATA_DIR,
    EXIT_REFUSED,
    MANIFEST_FILE,
    MODEL_DIR,
    REPORT_FILE,
    DataStats,
    PreparationReport,
    Refusal,
    termination_message,
)
from kubetune_api.trainer_config import TrainerConfig, dump_json

from . import chain
from .data_check import BadInputError, DataCheck
from .prepare_data import Refused, data_refusal

__all__ = ["Prepared", "Refused", "prepare", "prepared", "prepared_check"]

log = logging.getLogger("kubetune_trainer.prepare")

# Bump when the tokenized layout or its meaning changes: older prepared data is then not reused.
LAYOUT_VERSION = 1
# The files of a model that are downloaded: config, tokenizer, chat template, weights.
MODEL_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.model",
    "*.txt",
    "*.jinja",
    "*.tiktoken",
    "*.py",
]
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
TERMINATION_LOG_ENV = "KUBETUNE_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
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
    from .chat import CHATML_TEMPLATE

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
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def data_files_entry(cfg: TrainerConfig, root: Path) -> dict[str, Any]:
    """The data's files (a local path, or the Hub data set's downloaded files) with size and sha256."""
    from .data_check import splits_of
    from .prepare_data import DATASET_SOURCE_DIR

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


# --- the model --------------------------------------------------------------------------------------


def _hub_refusal(e: Exception, what: str, name: str, revision: str) -> Refused | None:
    """The Hub's answer as a refusal: 401/403 (gated, private) or 404 (no such repository or revision)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    gated, missing = (
        (Refusal.MODEL_GATED, Refusal.MODEL_NOT_FOUND)
        if what == "model"
        else (Refusal.DATASET_NOT_FOUND, Refusal.DATASET_NOT_FOUND)
    )
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, GatedRepoError) or status in (401, 403):
        return Refused(
            gated,
            f"the Hub refused {what} {name} (HTTP {status or 401}: gated or private); the job has "
            f"{'a' if os.environ.get('HF_TOKEN') else 'no'} token (spec.secrets.huggingFaceToken)",
        )
    if isinstance(e, RevisionNotFoundError):
        return Refused(missing, f"{what} {name} has no revision {revision!r} on the Hub")
    if isinstance(e, RepositoryNotFoundError | EntryNotFoundError) or status == 404:
        return Refused(missing, f"the Hub has no {what} {name!r} (HTTP 404)")
    return None  # another failure (a 5xx, no connection): an error of the step, not a refusal


def _verified(folder: Path, files: dict[str, Any]) -> bool:
    for name, meta in files.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != meta.get("size"):
            return False
        if file_sha256(path) != meta.get("sha256"):
            return False
    return bool(files)


def _download_model(
    cfg: TrainerConfig, root: Path, previous: dict[str, Any]
) -> tuple[Path, str, dict[str, Any]]:
    """The Hub model at its commit in ``prepared/model/`` (downloaded unless verified there)."""
    from huggingface_hub import HfApi, snapshot_download

    from .build import hf_token

    src = cfg.spec.model
    assert src.name is not None
    token = hf_token()
    try:
        sha = str(HfApi().model_info(src.name, revision=src.revision, token=token).sha)
    except Exception as e:
        refused = _hub_refusal(e, "model", src.name, src.revision)
        if refused is not None:
            raise refused from e
        raise
    folder = root / MODEL_DIR
    before = previous.get("model") or {}
    if (
        before.get("name") == src.name
        and before.get("revision") == sha
        and _verified(folder, before.get("files") or {})
    ):
        log.info("model %s@%s: already on the volume, verified", src.name, sha[:12])
        return folder, sha, before["files"]
    if folder.exists() and before.get("revision") not in (None, sha):
        shutil.rmtree(folder)  # another commit: nothing of it is reused
    # The same commit, recorded whole before, that fails the check: a file changed on the volume.
    # The Hub client would trust its own records of the files and keep them: download them again.
    again = before.get("name") == src.name and before.get("revision") == sha
    log.info("model %s: downloading commit %s into %s%s", src.name, sha, folder, " again" if again else "")
    try:
        snapshot_download(
            src.name,
            revision=sha,
            local_dir=folder,
            token=token,
            allow_patterns=MODEL_PATTERNS,
            force_download=again,
        )
    except Exception as e:
        refused = _hub_refusal(e, "model", src.name, src.revision)
        if refused is not None:
            raise refused from e
        raise
    files = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".cache" not in p.relative_to(folder).parts
    }
    return folder, sha, files


def _model(cfg: TrainerConfig, root: Path, previous: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Where the model is, and its manifest entry."""
    src = cfg.spec.model
    if chain.is_chained(cfg):
        return _starting_model(cfg, root)
    if src.path:
        folder = Path(src.path)
        if not (folder / "config.json").is_file():
            raise Refused(
                Refusal.MODEL_NOT_FOUND, f"spec.model.path {folder}: no model there (no config.json)"
            )
        return folder, {"path": str(folder), "downloaded": False}
    folder, sha, files = _download_model(cfg, root, previous)
    return folder, {"name": src.name, "revision": sha, "downloaded": True, "files": files}


def _starting_model(cfg: TrainerConfig, root: Path) -> tuple[Path, dict[str, Any]]:
    """A chained job's starting model (:mod:`.chain`), put in place on the volume once; a parent or
    registered model that cannot be had is refused (ModelNotFound), naming the field."""
    try:
        start = chain.ensure_start(cfg, root)
    except chain.ChainError as e:
        raise Refused(Refusal.MODEL_NOT_FOUND, str(e)) from e
    entry: dict[str, Any] = {"path": str(start.folder), "downloaded": False, "start": start.source}
    if start.parent.model_uri and not start.parent.job:
        entry["revision"] = start.parent.model_uri  # the version a registered alias resolved to
    return start.folder, entry


def _tokenizer(cfg: TrainerConfig, model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    from .chat import ensure_chat_format

    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=cfg.spec.model.trust_remote_code)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    ensure_chat_format(None, tokenizer)
    return tokenizer, has_template


def hub_data_refusal(cfg: TrainerConfig, e: Exception) -> Refused | None:
    """A Hub data set the Hub refused or does not have."""
    src = cfg.spec.dataset
    if not src.name:
        return None
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, Exception):
            refused = _hub_refusal(cause, "data set", src.name, src.revision)
            if refused is not None:
                return refused
        if type(cause).__name__ == "DatasetNotFoundError":
            return Refused(Refusal.DATASET_NOT_FOUND, f"the Hub has no data set {src.name!r}: {cause}")
        cause = cause.__cause__
    return None


# --- the whole step ---------------------------------------------------------------------------------


def _save(dataset: Any, folder: Path) -> None:
    """Save atomically: a temporary folder renamed into place."""
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    dataset.save_to_disk(str(tmp))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)


def _tokenized(
    cfg: TrainerConfig, root: Path, key: str, tokenizer: Any, train: Any, evaluation: Any
) -> tuple[Any, Any, bool]:
    """The tokenized splits: from the volume when this key is there (True), else tokenized (False)."""
    from datasets import load_from_disk

    from .prepare_data import tokenize

    folder = root / DATA_DIR / key
    if (folder / "COMPLETE").is_file():
        log.info("tokenized data %s: already on the volume", key)
        evaluation_tok = load_from_disk(str(folder / "eval")) if (folder / "eval").is_dir() else None
        return load_from_disk(str(folder / "train")), evaluation_tok, True
    train_tok = tokenize(cfg, tokenizer, train, "train")
    eval_tok = tokenize(cfg, tokenizer, evaluation, "eval") if evaluation is not None else None
    return train_tok, eval_tok, False


def _save_tokenized(root: Path, key: str, train: Any, evaluation: Any) -> None:
    """Both splits, then the COMPLETE marker: a folder without it is never read."""
    folder = root / DATA_DIR / key
    folder.mkdir(parents=True, exist_ok=True)
    _save(train, folder / "train")
    if evaluation is not None:
        _save(evaluation, folder / "eval")
    (folder / "COMPLETE").write_text(json.dumps({"key": key, "layout": LAYOUT_VERSION}))


def _estimate(cfg: TrainerConfig, model_dir: Path, data: DataStats) -> Any:
    """The plan's estimate for the job's GPUs (:mod:`.estimate`); refuses a job that does not fit."""
    from . import estimate
    from .build import shape_from_config

    if cfg.spec.resources.gpus_per_node == 0:
        return None  # CPU training: nothing GPU-sized to estimate
    conf = json.loads((model_dir / "config.json").read_text())
    shape = shape_from_config(conf.get("text_config") or conf)
    est = estimate.estimate(cfg, shape, data)
    problem = estimate.does_not_fit(cfg, shape, data, est)
    unknown_product = est.gpu_product_assumed and cfg.spec.resources.gpu_product is not None
    if problem is not None and unknown_product:
        log.warning("%s; not refused: the memory of %s is not known to kubetune", problem, est.gpu_product)
    elif problem is not None:
        raise Refused(Refusal.DOES_NOT_FIT, problem)
    return est


def prepare(cfg: TrainerConfig, *, root: Path | None = None) -> PreparationReport:
    """Download, check, tokenize and estimate as ``cfg`` says; :class:`Refused` for input to fix."""
    from .prepare_data import check_template, check_truncation, load, stats

    started = time.monotonic()
    root = Path(root or cfg.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    previous = read_manifest(root)
    model_dir, model_entry = _model(cfg, root, previous)
    tokenizer, has_template = _tokenizer(cfg, model_dir)
    checked, train, evaluation, fmt = load(cfg, root)
    check_template(cfg, has_template, fmt)
    tok_hash = tokenizer_hash(model_dir)
    key = tokenization_key(cfg, tok_hash, checked.data_hash, fmt)
    train_tok, eval_tok, reused = _tokenized(cfg, root, key, tokenizer, train, evaluation)
    data = stats(cfg, train_tok, eval_tok)
    check_truncation(cfg, data)
    est = _estimate(cfg, model_dir, data)
    if not reused:  # only what passed every check is kept
        _save_tokenized(root, key, train_tok, eval_tok)
    tokenized_hash = folder_hash(root / DATA_DIR / key)
    src = cfg.spec.dataset
    report = PreparationReport(
        model_revision=model_entry.get("revision"),
        dataset_revision=checked.revision,
        dataset_hash=checked.data_hash,
        tokenized_key=key,
        tokenized_hash=tokenized_hash,
        reused=reused,
        data=data,
        estimate=est,
        seconds=round(time.monotonic() - started, 1),
    )
    manifest = {
        "layout": LAYOUT_VERSION,
        "model": model_entry,
        "data": {
            "source": src.name or src.path,
            "revision": checked.revision,
            "dataHash": checked.data_hash,
            "format": fmt,
            "key": key,
            "tokenizerHash": tok_hash,
            "tokenizedHash": tokenized_hash,
            "files": data_files_entry(cfg, root),
        },
        "report": report.wire(),
    }
    dump_json(manifest, root / MANIFEST_FILE)
    dump_json(report.wire(), root / REPORT_FILE)
    return report


# --- the command ------------------------------------------------------------------------------------


def write_termination_log(text: str) -> None:
    path = Path(os.environ.get(TERMINATION_LOG_ENV) or DEFAULT_TERMINATION_LOG)
    with contextlib.suppress(OSError):  # not in a pod
        path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    from .train import Dist, load_config, setup_logging

    parser = argparse.ArgumentParser(
        prog="python -m kubetune_trainer.prepare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--config", type=Path, required=True, help="the trainer config (YAML)")
    args = parser.parse_args(argv)
    setup_logging(Dist.from_env())
    if not sys.stderr.isatty():
        import datasets

        datasets.disable_progress_bars()  # in a pod the bars are noise in the log
    try:
        try:
            cfg = load_config(args.config)
            report = prepare(cfg)
        except BadInputError as e:  # a bad input found outside the data's own check: named too
            raise Refused(data_refusal(str(e)), str(e)) from e
    except Refused as e:
        r = e.refusal
        log.error("refused (%s): %s", r.reason, r.message)
        log.error("what to do: %s", r.hint)
        write_termination_log(termination_message(r))
        return EXIT_REFUSED
    write_termination_log(termination_message(report))
    log.info("prepared: %s", report.summary())
    print(json.dumps(report.wire(), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    # the package's module, not this __main__ copy: Refused and friends are its classes
    from kubetune_trainer.prepare import main as package_main

    sys.exit(package_main())
