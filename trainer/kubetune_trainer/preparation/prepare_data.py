"""The data half of the preparation step (:mod:`.prepare`): load and check as the trainer does,
tokenize with TRL's own dataset preparation, and measure what training will see.

Tokens: TRL's ``SFTTrainer._prepare_dataset`` turns rows into ``input_ids`` and ``labels`` (the chat
template, assistant and completion masks, the end-of-sequence token of text rows) before it
truncates or packs them. Preparation runs exactly that first part, once, on CPU (no model, no
truncation, no packing, no shuffling); the trainer then gives TRL the saved columns, which it takes
as already tokenized, and TRL packs or truncates them as it would have after its own tokenization.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kubetune_api.preparation import DataStats, PreparationRefusal, Refusal
from kubetune_api.spec import DatasetFormat
from kubetune_api.trainer_config import TrainerConfig

from .data_check import DataCheck, DataError

log = logging.getLogger("kubetune_trainer.prepare")


class Refused(Exception):  # noqa: N818  a refusal, not an error of kubetune's
    """The job cannot train as it is; ``refusal`` says why and what to do."""

    def __init__(self, reason: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = PreparationRefusal.of(reason, message)


# What a DataError's message says, as a refusal reason (the first that matches; else DatasetSchema).
_DATA_REFUSALS = (
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


DATASET_SOURCE_DIR = "prepared/dataset"  # a Hub data set's files at the resolved commit
DATA_PATTERNS = ["*.jsonl", "*.json", "*.parquet"]
# JSON files of a data set repository that describe it and hold no rows
METADATA_FILES = ["dataset_info*.json", "dataset_dict.json", "state.json", "*config*.json"]


def download_dataset(cfg: TrainerConfig, root: Path) -> tuple[TrainerConfig, str]:
    """A Hub data set's files at their commit in ``prepared/dataset/`` (its subset's folder when the
    spec names one), and the config that reads them from there as local files; the commit."""
    from huggingface_hub import HfApi, snapshot_download

    from .build import hf_token
    from .prepare import hub_data_refusal

    src = cfg.spec.dataset
    assert src.name is not None
    try:
        sha = str(HfApi().dataset_info(src.name, revision=src.revision, token=hf_token()).sha)
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
            token=hf_token(),
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
    import json
    import shutil

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
    from . import build, data_check

    src, local = cfg.spec.dataset, cfg
    identity: DataCheck | None = None
    if src.name:
        local, sha = download_dataset(cfg, root)
        identity = data_check.check(src.model_copy(update={"revision": sha}))
    try:
        # the data as it is now: never what an earlier preparation recorded
        checked = build.check_raw_data(local)
        train, evaluation, fmt = build.raw_datasets(local, checked)
    except DataError as e:
        raise Refused(data_refusal(str(e)), str(e)) from e
    if len(train) == 0:
        where = src.name or src.path
        raise Refused(Refusal.DATASET_EMPTY, f"{where}: split {src.split!r} has no rows")
    if identity is not None:
        checked = DataCheck(
            format=fmt, data_hash=identity.data_hash, revision=identity.revision, rows=checked.rows
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
    lengths.sort()
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


def check_truncation(cfg: TrainerConfig, data: DataStats) -> None:

    allowed = cfg.spec.preparation.max_truncated_fraction
    if data.truncated_fraction > allowed:
        raise Refused(
            Refusal.MOSTLY_TRUNCATED,
            f"{100 * data.truncated_fraction:.3g}% of the training examples are longer than "
            f"spec.training.maxLength {cfg.spec.training.max_length} (the allowed share is "
            f"{100 * allowed:.0f}%; lengths p50 {data.length_p50}, p95 {data.length_p95}, max {data.length_max})",
        )


def check_template(cfg: TrainerConfig, has_template: bool, fmt: str) -> None:

    if fmt == DatasetFormat.MESSAGES and not has_template:
        where = cfg.spec.model.name or cfg.spec.model.path
        raise Refused(
            Refusal.CHAT_TEMPLATE_MISSING,
            f"the tokenizer of {where} has no chat template, and the data is chat (messages): "
            "its turns would be rendered in a format the model never saw",
        )
