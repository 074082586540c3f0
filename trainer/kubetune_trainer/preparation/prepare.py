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
   :mod:`..sources.chain` (``prepared/start.json``), and its tokenizer tokenizes the data;
2. the data: read and checked row by row as the trainer reads it (:mod:`..sources.data_check`,
   :func:`..sources.data.raw_datasets`: a ShareGPT or Alpaca layout, renamed columns and roles
   converted into kubetune's own columns by :mod:`..sources.layout`, format detection, splits, eval
   fraction), then tokenized with
   TRL's own dataset preparation (chat template, assistant and completion masks, labels) and saved
   with ``save_to_disk`` under ``prepared/data/<key>/``, ``key`` a hash of everything that changes
   the tokens. The trainer hands these to TRL, which packs or truncates them as it would have
   done after its own tokenization: the same tokens and labels either way. Preference pairs
   (objective dpo or orpo: :mod:`..sources.preference`) are measured with the tokenizer (a prompt
   that fills maxLength is refused) and kept as checked: TRL's preference trainers tokenize them;
3. the statistics and the estimate (:mod:`..plan.estimate`: the trainer's plan for the GPUs the job asks
   for), the manifest (``prepared/manifest.json``) and the report (``prepared/report.json``, and
   the pod's termination message for the operator).

Input the user must fix raises :class:`Refused` with a :class:`~kubetune_api.preparation.Refusal`;
the command exits ``EXIT_REFUSED`` (2) with the refusal as its termination message.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kubetune_api.preparation import (
    DATA_DIR,
    EXIT_REFUSED,
    MANIFEST_FILE,
    MODEL_DIR,
    REPORT_FILE,
    DataStats,
    PreparationRefusal,
    PreparationReport,
    Refusal,
    termination_message,
)
from kubetune_api.spec import DatasetFormat
from kubetune_api.trainer_config import TERMINATION_MESSAGE_PATH, TrainerConfig, dump_json

from .. import settings
from ..plan import estimate
from ..plan.plan import shape_from_config
from ..process import Dist, load_config, setup_logging, share_cpus, skip_unused_libraries
from ..sources import chain, data_check, preference
from ..sources.chat import ensure_chat_format
from ..sources.data import check_raw_data, raw_datasets
from ..sources.data_check import BadInputError, DataCheck, DataError
from ..sources.prepared import (
    DATASET_SOURCE_DIR,
    LAYOUT_VERSION,
    data_files_entry,
    file_sha256,
    folder_hash,
    read_manifest,
    tokenization_key,
    tokenizer_hash,
)

__all__ = ["Refused", "main", "prepare"]

log = logging.getLogger("kubetune_trainer.prepare")

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


class Refused(Exception):  # noqa: N818  a refusal, not an error of kubetune's
    """The job cannot train as it is; ``refusal`` says why and what to do."""

    def __init__(self, reason: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = PreparationRefusal.of(reason, message)


# What a DataError's message says, as a refusal reason (the first that matches; else DatasetSchema).
_DATA_REFUSALS = (
    (preference.MISSING_COLUMNS, Refusal.PREFERENCE_COLUMNS),
    (preference.SAME_ANSWERS, Refusal.IDENTICAL_ANSWERS),
    ("the file has no rows", Refusal.DATASET_EMPTY),
    ("no .jsonl, .json or .parquet files", Refusal.DATASET_EMPTY),
    ("has no 'assistant' message", Refusal.NO_ASSISTANT_TURNS),
    ("has no assistant tokens", Refusal.NO_ASSISTANT_TURNS),
    ("does not exist", Refusal.DATASET_NOT_FOUND),
    ("has no split", Refusal.DATASET_NOT_FOUND),
    ("has no eval split", Refusal.DATASET_NOT_FOUND),
)


def data_refusal(message: str) -> Refusal:
    """The refusal reason of a data problem's message.

    >>> data_refusal("data/x.jsonl: the file has no rows; expected one JSON object per line")
    <Refusal.DATASET_EMPTY: 'DatasetEmpty'>
    >>> data_refusal("x.jsonl line 2: column 'messages' is missing")
    <Refusal.DATASET_SCHEMA: 'DatasetSchema'>
    """
    for words, reason in _DATA_REFUSALS:
        if words in message:
            return reason
    return Refusal.DATASET_SCHEMA


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
            f"{'a' if settings.current().hf_token else 'no'} token (spec.secrets.huggingFaceToken)",
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

    src = cfg.spec.model
    assert src.name is not None
    token = settings.current().hf_token
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
    """A chained job's starting model (:mod:`..sources.chain`), put in place on the volume once; a parent or
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

    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=cfg.spec.model.trust_remote_code)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    ensure_chat_format(None, tokenizer)
    return tokenizer, has_template


# --- the data ---------------------------------------------------------------------------------------


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


DATA_PATTERNS = ["*.jsonl", "*.json", "*.parquet"]
# JSON files of a data set repository that describe it and hold no rows
METADATA_FILES = ["dataset_info*.json", "dataset_dict.json", "state.json", "*config*.json"]


def download_dataset(cfg: TrainerConfig, root: Path) -> tuple[TrainerConfig, str]:
    """A Hub data set's files at their commit in ``prepared/dataset/`` (its subset's folder when the
    spec names one), and the config that reads them from there as local files; the commit."""
    from huggingface_hub import HfApi, snapshot_download

    src = cfg.spec.dataset
    assert src.name is not None
    try:
        sha = str(
            HfApi().dataset_info(src.name, revision=src.revision, token=settings.current().hf_token).sha
        )
        folder = root / DATASET_SOURCE_DIR
        _only_files_of(folder, {"name": src.name, "subset": src.subset, "revision": sha})
        # a subset's files are in its folder at the top or under data/ (both layouts are common)
        # (fnmatch: "*" also matches "/", so a pattern takes the files of every folder below)
        places = (f"{src.subset}/", f"data/{src.subset}/") if src.subset else ("",)
        patterns = [f"{place}{p}" for place in places for p in DATA_PATTERNS]
        log.info("data set %s: downloading commit %s into %s", src.name, sha, folder)
        snapshot_download(
            src.name,
            repo_type="dataset",
            revision=sha,
            local_dir=folder,
            token=settings.current().hf_token,
            allow_patterns=patterns,
            ignore_patterns=METADATA_FILES,
        )
    except Exception as e:
        refused = hub_data_refusal(cfg, e)
        if refused is not None:
            raise refused from e
        raise
    where = folder
    if src.subset:
        where = folder / src.subset if (folder / src.subset).is_dir() else folder / "data" / src.subset
    local = src.model_copy(update={"name": None, "path": str(where)})
    return cfg.model_copy(update={"spec": cfg.spec.model_copy(update={"dataset": local})}), sha


SOURCE_FILE = ".kubetune-source.json"  # which data set, subset and commit the folder's files are of


def _only_files_of(folder: Path, source: dict[str, Any]) -> None:
    """Empty ``folder`` unless its files are of ``source`` (a download of it may be resumed): every
    data file in it is read, and a file another commit removed or renamed, or another data set's,
    would be trained on. The record is written before the download starts."""
    record = folder / SOURCE_FILE
    try:
        same = json.loads(record.read_text()) == source
    except (OSError, ValueError):
        same = False
    if not same and folder.exists():
        log.info("data set folder %s holds other files than %s: emptied", folder, source)
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(source, sort_keys=True))


def load(cfg: TrainerConfig, root: Path) -> tuple[DataCheck, Any, Any, str]:
    """The data as the trainer loads it: every row checked, splits and eval fraction, the format.
    A Hub data set is downloaded first and read as local files; its identity stays the Hub commit's
    (what the trainer records without preparation)."""
    src, local = cfg.spec.dataset, cfg
    identity: DataCheck | None = None
    if src.name:
        local, sha = download_dataset(cfg, root)
        identity = data_check.check(src.model_copy(update={"revision": sha}))
    try:
        # the data as it is now: never what an earlier preparation recorded
        checked = check_raw_data(local)
        train, evaluation, fmt = raw_datasets(local, checked)
    except DataError as e:
        raise Refused(data_refusal(str(e)), str(e)) from e
    if len(train) == 0:
        where = src.name or src.path
        raise Refused(Refusal.DATASET_EMPTY, f"{where}: split {src.split!r} has no rows")
    if identity is not None:
        checked = DataCheck(
            format=fmt,
            data_hash=identity.data_hash,
            revision=identity.revision,
            rows=checked.rows,
            layout=checked.layout,
            converted=checked.converted,
        )
    return checked, train, evaluation, fmt


def tokenize(cfg: TrainerConfig, tokenizer: Any, dataset: Any, name: str) -> Any:
    """``input_ids`` and ``labels`` of every row, by TRL's own preparation (see the module docstring)."""
    from jinja2 import TemplateError
    from trl import SFTConfig, SFTTrainer
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    t = cfg.spec.training
    columns = set(dataset.column_names)
    with tempfile.TemporaryDirectory() as scratch:
        args = SFTConfig(
            output_dir=scratch,
            max_length=None,  # the trainer truncates or packs: lengths are measured here
            packing=False,
            shuffle_dataset=False,
            assistant_only_loss=t.assistant_only_loss,
            dataset_text_field="text",
            report_to="none",
            use_cpu=True,
        )
    template = None
    if t.assistant_only_loss and not has_generation_markers(tokenizer.chat_template):
        template = get_training_chat_template(tokenizer)
    # what SFTTrainer.__init__ decides before it prepares a data set (the trainer's own object)
    decided: Any = SimpleNamespace(
        _tokenizer=tokenizer,
        chat_template=template,
        completion_only_loss="prompt" in columns and "completion" in columns,
    )
    try:
        return SFTTrainer._prepare_dataset(decided, dataset, tokenizer, args, False, None, name)
    except RuntimeError as e:
        if "no assistant tokens" in str(e):
            raise Refused(
                Refusal.NO_ASSISTANT_TURNS,
                f"{name}: an example has no assistant tokens under the chat template (it may lack "
                "{% generation %} markers for assistant-only loss)",
            ) from e
        raise
    except TemplateError as e:  # the template's own raise_exception: a role it does not take, or order
        raise Refused(
            Refusal.DATASET_SCHEMA,
            f"{name}: the model's chat template refuses an example: {e} (rows whose roles the "
            "template does not accept, e.g. a system turn, or turns that do not alternate user/assistant)",
        ) from e


def pair_stats(cfg: TrainerConfig, tokenizer: Any, train: Any, evaluation: Any) -> DataStats:
    """What preference training sees of the pairs: a pair is as long as its prompt and its longer
    answer; its tokens are both sequences (prompt + chosen, prompt + rejected) up to maxLength, of which
    the answers' count in the loss. A prompt that fills maxLength is refused (:data:`Refusal.PROMPT_TRUNCATED`)."""
    limit = cfg.spec.training.max_length
    lengths: list[int] = []
    tokens = loss_tokens = truncated = 0
    filled: list[int] = []
    for n, row in enumerate(train, 1):
        prompt, chosen, rejected = preference.pair_lengths(tokenizer, row)
        if prompt >= limit:
            filled.append(n)
        lengths.append(prompt + max(chosen, rejected))
        truncated += prompt + max(chosen, rejected) > limit
        for answer in (chosen, rejected):
            tokens += min(limit, prompt + answer)
            loss_tokens += max(0, min(limit, prompt + answer) - prompt)
    if filled:
        first = ", ".join(str(n) for n in filled[:5])
        raise Refused(
            Refusal.PROMPT_TRUNCATED,
            f"{len(filled)} of {len(lengths)} training pairs have a prompt of spec.training.maxLength {limit} "
            f"tokens or more (row(s) {first}{', ...' if len(filled) > 5 else ''} of split "
            f"{cfg.spec.dataset.split!r}): neither answer would be seen",
        )
    return _data_stats(lengths, evaluation, tokens, loss_tokens, truncated)


def _data_stats(
    lengths: list[int], evaluation: Any, tokens: int, loss_tokens: int, truncated: int
) -> DataStats:
    """The statistics of the training rows (``lengths``: each row's, before truncation), SFT's or pairs'."""
    lengths = sorted(lengths)
    count = len(lengths)
    return DataStats(
        train_examples=count,
        eval_examples=len(evaluation) if evaluation is not None else 0,
        tokens=tokens,
        length_p50=_percentile(lengths, 0.5),
        length_p95=_percentile(lengths, 0.95),
        length_max=lengths[-1] if lengths else 0,
        # not rounded: the refusal compares it with the allowed share (1 of 20,001 is above 0)
        truncated_fraction=truncated / count if count else 0.0,
        loss_token_fraction=round(loss_tokens / tokens, 4) if tokens else 0.0,
    )


def _percentile(sorted_values: list[int], q: float) -> int:
    if not sorted_values:
        return 0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def stats(cfg: TrainerConfig, train: Any, evaluation: Any) -> DataStats:
    """What training sees: lengths before truncation, tokens and loss tokens after it."""
    limit = cfg.spec.training.max_length
    lengths: list[int] = []
    tokens = loss_tokens = truncated = 0
    for row in train.select_columns(["input_ids", "labels"]):
        n = len(row["input_ids"])
        lengths.append(n)
        kept = row["labels"][:limit]
        tokens += len(kept)
        loss_tokens += sum(1 for label in kept if label != -100)
        truncated += n > limit
    return _data_stats(lengths, evaluation, tokens, loss_tokens, truncated)


def check_truncation(cfg: TrainerConfig, data: DataStats) -> None:

    allowed = cfg.spec.preparation.max_truncated_fraction
    if data.truncated_fraction > allowed:
        raise Refused(
            Refusal.MOSTLY_TRUNCATED,
            f"{100 * data.truncated_fraction:.3g}% of the training examples are longer than "
            f"spec.training.maxLength {cfg.spec.training.max_length} (the allowed share is "
            f"{100 * allowed:.0f}%; lengths p50 {data.length_p50}, p95 {data.length_p95}, max {data.length_max})",
        )


def check_template(cfg: TrainerConfig, has_template: bool, fmt: str, train: Any = None) -> None:

    chat = fmt == DatasetFormat.MESSAGES or (
        fmt == preference.PAIR_FORMAT
        and train is not None
        and len(train)
        and preference.is_conversational(train[0])
    )
    if chat and not has_template:
        where = cfg.spec.model.name or cfg.spec.model.path
        raise Refused(
            Refusal.CHAT_TEMPLATE_MISSING,
            f"the tokenizer of {where} has no chat template, and the data is chat (messages): "
            "its turns would be rendered in a format the model never saw",
        )


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

    folder = root / DATA_DIR / key
    if (folder / "COMPLETE").is_file():
        log.info("tokenized data %s: already on the volume", key)
        evaluation_tok = load_from_disk(str(folder / "eval")) if (folder / "eval").is_dir() else None
        return load_from_disk(str(folder / "train")), evaluation_tok, True
    if cfg.spec.prefers:
        # pairs are kept as checked: TRL's preference trainers tokenize them (prompt and each answer)
        return train, evaluation, False
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
    """The plan's estimate for the job's GPUs (:mod:`..plan.estimate`); refuses a job that does not fit."""

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

    started = time.monotonic()
    method = estimate.method_refusal(cfg)  # before anything is downloaded
    if method is not None:
        raise Refused(Refusal.QUANTIZATION_NOT_SUPPORTED, method)
    root = Path(root or cfg.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    previous = read_manifest(root)
    model_dir, model_entry = _model(cfg, root, previous)
    tokenizer, has_template = _tokenizer(cfg, model_dir)
    checked, train, evaluation, fmt = load(cfg, root)
    check_template(cfg, has_template, fmt, train)
    tok_hash = tokenizer_hash(model_dir)
    key = tokenization_key(cfg, tok_hash, checked.data_hash, fmt)
    train_tok, eval_tok, reused = _tokenized(cfg, root, key, tokenizer, train, evaluation)
    data = (
        pair_stats(cfg, tokenizer, train, evaluation) if cfg.spec.prefers else stats(cfg, train_tok, eval_tok)
    )
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
        dataset_layout=checked.layout,
        converted_rows=checked.converted,
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
            "layout": checked.layout,
            "convertedRows": checked.converted,
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


def write_termination_log(text: str, path: Path | None = None) -> None:
    """The report for the operator, at ``path`` (``--termination-log``) or the kubelet's file (never a
    path from the environment: kubetune_trainer.settings)."""
    target = path or Path(TERMINATION_MESSAGE_PATH)
    with contextlib.suppress(OSError):  # not in a pod
        target.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kubetune_trainer.prepare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--config", type=Path, required=True, help="the trainer config (YAML)")
    parser.add_argument(
        "--termination-log",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"where the report for the operator goes (default: {TERMINATION_MESSAGE_PATH}, the kubelet's "
        "file; never from the environment)",
    )
    args = parser.parse_args(argv)
    skip_unused_libraries()
    share_cpus()
    setup_logging(Dist.from_env())
    settings.warn_ignored_control(log, "prepare")
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
        write_termination_log(termination_message(r), args.termination_log)
        return EXIT_REFUSED
    write_termination_log(termination_message(report), args.termination_log)
    log.info("prepared: %s", report.summary())
    print(json.dumps(report.wire(), indent=2, sort_keys=True))
    return 0
