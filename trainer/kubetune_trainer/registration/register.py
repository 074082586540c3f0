"""Register the trained model in MLflow: the post-training step (a ``batch/v1`` Job, no GPU).

    python -m kubetune_trainer.register --config /etc/kubetune/config.yaml
    python -m kubetune_trainer.register --config job.yaml --retry-budget 30 --termination-message-path /tmp/t

It reads the trainer config, loads the final model from ``<output_dir>/final`` (refused without its
``COMPLETE`` marker), logs it with MLflow's transformers flavour as a chat model (``llm/v1/chat``)
into the job's training run (``<output_dir>/mlflow-run.json``; created when training could not reach
MLflow), registers it under the config's registered model name, points the alias at it, and tags
the version and the run with the job's lineage. The result ``{name, version, uri, run_id, alias}``
goes to ``<output_dir>/register-result.json`` and to the container's termination message, where
the operator reads it from the pod status.

LoRA:

* ``registration.mergeLora: true`` (the default, as the notebooks do): the adapter is merged into
  the base model (``merge_and_unload``); the MLflow model is a plain, self-contained transformers
  model.
* ``mergeLora: false``: the MLflow model is the PEFT model, and only the adapter and the trained
  tokenizer are stored. The base model is referenced, as MLflow's PEFT support does it: a base on a
  volume by its path (``base_model_path``; loading needs that path, or
  ``mlflow.transformers.load_model(uri, base_model_path=...)``); a Hub base by its repository id,
  at the commit MLflow resolves on the Hub when logging (the Hub's newest for that id, which
  may differ from a pinned ``model.revision``; the version's ``kubetune.base_model.revision`` tag
  keeps the one trained on). MLflow also takes the tokenizer of a Hub base from the Hub, so a
  template added in training is lost: keep ``mergeLora: true`` unless the adapter alone is wanted.

Idempotent: a model version of this registered model whose tags carry this job's identity and
config hash, logged from this run, is reused (run it twice, get one version). A logged model of
this run with the same tags that was never registered (the step was interrupted between logging
and registering) is registered instead of logging again. Each MLflow step looks again before it
writes, so a retry after a lost response does not duplicate either.

Exactly once, also when registrations overlap (a Job's replacement pod while the old one still
runs, a retry racing a slow pod): looking before writing is not enough, as both would look, find
nothing and write. So the whole step runs under a claim, an exclusive ``flock`` on
``<output_dir>/register.lock`` on the job's checkpoint volume (:class:`RegistrationClaim`): one
process registers, the others wait for it (``--claim-wait``, default an hour), then find its version and report the same result. The lock
ends with its holder, however it dies; the next one takes over at once and deletes the holder's
unfinished upload (a logged model left ``PENDING``). The operator's Job also starts a retry's
pod only once the previous pod has ended (``podReplacementPolicy: Failed``).

MLflow unreachable (connection errors, timeouts, 5xx, 408, 429): retried with exponential backoff
(1 s, doubling, at most 30 s, +-20% jitter) until it has been unreachable for ``--retry-budget``
seconds in total over the whole registration (default 600);
failed attempts and waits both count, and no wait runs past the budget, so the process gives up
within the budget plus one attempt (an attempt ends by ``MLFLOW_HTTP_REQUEST_TIMEOUT``, 120 s by
default). MLflow's own per-request retries are off unless ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` is
set, so they do not multiply with these. MLflow refusing (4xx: permission denied, invalid name):
no retry. Either way the error names the tracking URI. Local steps (loading and merging the model)
are not retried: a failure there is not MLflow's.

What is registered (``spec.registration.select``): ``final`` (the default, ``<output_dir>/final``)
or ``bestEval``: the checkpoint (or final model) with the lowest eval loss
(:func:`kubetune_trainer.volume.catalog.select_for_registration`), loaded as the final model is (a
checkpoint without the tokenizer takes final/'s). The version is tagged ``kubetune.selected``
(``final`` or ``checkpoint-<step>``). With ``spec.registration.gate`` its eval loss must beat the
threshold (:mod:`kubetune_trainer.registration.gate`): not met, nothing is registered, the gate's numbers are
logged in the run, and the result says ``GateNotMet`` (exit code 5); ``--force`` (only on the
command line: the operator writes it for a ``kubetune.io/retry-registration``; never from the
environment) registers it anyway, tagged ``kubetune.gate.forced=true``. A gate
met tags the version ``kubetune.gate.*`` (threshold, eval_loss, base_eval_loss, passed). A
version already registered for this job is reported as it is, gate or not (idempotent).

The result also carries ``selected``, ``evaluation`` (``status.evaluation``) and, for an http(s)
tracking server, the UI links ``url`` (the version) and ``run_url`` (the run).

Exit codes: 0 registered (or already registered, or registration disabled); 1 unexpected error;
2 nothing to register (no complete final model, or a model that does not match the spec);
3 MLflow refused; 4 MLflow unreachable for the whole retry budget; 5 the gate was not met
(``GateNotMet``: nothing registered, not an error to retry).

Credentials come only from the environment (``MLFLOW_TRACKING_TOKEN``/``USERNAME``/``PASSWORD``,
``HF_TOKEN``); their values never reach logs, tags, params or results.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kubetune_api import registration as registration_contract
from kubetune_api.mlflow_links import model_version_url, run_url
from kubetune_api.spec import Method
from kubetune_api.trainer_config import (
    COMPLETE_MARKER,
    FINAL_DIR,
    REGISTER_RESULT_FILE,
    TERMINATION_MESSAGE_PATH,
    TrainerConfig,
    dump_json,
)

from .. import settings
from ..mlflow.client import (
    MlflowError,
    MlflowRefusedError,
    MlflowUnavailableError,
    Retrier,
    configure_mlflow_http,
    install_log_redaction,
    redacted_stdio,
)
from ..mlflow.run import JobRun, identity_tags, redact, resolve_registry_uri, resolve_tracking_uri, same_job
from ..process import share_cpus, skip_unused_libraries
from ..sources.model import model_source
from ..volume import checkpoints
from ..volume.catalog import Selected, base_eval_loss, select_for_registration
from .claim import DEFAULT_CLAIM_WAIT_S, ClaimError, RegistrationClaim
from .gate import REASON_GATE_NOT_MET, TAG_FORCED, GateNotMetError, Verdict, decide
from .lineage import provenance_tags

log = logging.getLogger("kubetune_trainer.register")

TASK = "llm/v1/chat"
MODEL_NAME_IN_RUN = "model"
DEFAULT_TERMINATION_MESSAGE_PATH = TERMINATION_MESSAGE_PATH
# The registration's control settings: the command line's (the operator writes it), else these; never
# the environment (kubetune_trainer.settings)
DEFAULT_RETRY_BUDGET_S = 600.0
# The kubelet keeps at most 4096 bytes of a termination message.
TERMINATION_MESSAGE_LIMIT = 4096
# Seconds to wait for a new model version to become READY (OSS servers create it READY at once).
AWAIT_REGISTRATION_S = 300

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_NOTHING_TO_REGISTER = 2
EXIT_REFUSED = 3
EXIT_UNAVAILABLE = 4
EXIT_GATE_NOT_MET = registration_contract.EXIT_GATE_NOT_MET  # 5

# Lineage tags, on the model version, the logged model and the run. The job/config-hash keys are
# the ones the trainer tags its run with (kubetune_trainer.mlflow.run); they also make
# registration idempotent.
TAG_BASE_MODEL = "kubetune.base_model"
TAG_BASE_MODEL_REVISION = "kubetune.base_model.revision"
TAG_DATASET = "kubetune.dataset"
TAG_DATASET_REVISION = "kubetune.dataset.revision"
TAG_METHOD = "kubetune.method"
TAG_LORA_MERGED = "kubetune.lora_merged"
TAG_REGISTERED_MODEL = "kubetune.registered_model"
# the alias kubetune last pointed at a version (so a changed registration.alias moves only its own)
TAG_ALIAS = "kubetune.alias"


# --- what to tag ----------------------------------------------------------------------------------------


def lineage_tags(cfg: TrainerConfig) -> dict[str, str]:
    """Where the model came from: job, base model, data set, method, config hash. Never a secret."""
    spec = cfg.spec
    tags = {**identity_tags(cfg), TAG_METHOD: str(spec.method)}
    if spec.model.name:
        tags[TAG_BASE_MODEL] = spec.model.name
        tags[TAG_BASE_MODEL_REVISION] = spec.model.revision
    else:  # a path, or a chained job's parent (kubetune.parent.* tags say which version or job)
        ref = spec.model.from_job
        tags[TAG_BASE_MODEL] = str(
            spec.model.path or spec.model.registered or f"fromJob:{ref.name if ref else ''}"
        )
    if spec.dataset.name:
        subset = f":{spec.dataset.subset}" if spec.dataset.subset else ""
        tags[TAG_DATASET] = f"{spec.dataset.name}{subset}"
        tags[TAG_DATASET_REVISION] = spec.dataset.revision
    else:
        tags[TAG_DATASET] = str(spec.dataset.path)
    if spec.method == Method.LORA:
        tags[TAG_LORA_MERGED] = str(spec.registration.merge_lora).lower()
    # the exact sources the preparation step resolved, the image and the library versions
    tags.update(provenance_tags(cfg.output_dir))
    return tags


# --- which folder is registered -------------------------------------------------------------------------


class NothingToRegisterError(RuntimeError):
    """No complete final model, or one that does not match the spec."""


def final_dir(cfg: TrainerConfig) -> Path:
    """``<output_dir>/final``, refused unless training marked it complete and it matches the spec."""
    final = Path(cfg.output_dir) / FINAL_DIR
    if not (final / COMPLETE_MARKER).exists():
        raise NothingToRegisterError(
            f"{final} has no {COMPLETE_MARKER} marker: training did not finish writing the final model "
            "(nothing to register)"
        )
    written = checkpoints.marked_training(final)
    if written and written != cfg.training_hash():
        raise NothingToRegisterError(
            f"{final} was written by another training (training hash {written}, this job's "
            f"{cfg.training_hash()}): it is not this job's model (a reused storage claim?)"
        )
    _check_weights(cfg, final)
    return final


def _check_weights(cfg: TrainerConfig, folder: Path) -> None:
    has_adapter = (folder / "adapter_config.json").exists()
    if cfg.spec.method == Method.LORA and not has_adapter:
        raise NothingToRegisterError(f"{folder}: method is lora but there is no adapter_config.json")
    if cfg.spec.method == Method.FULL and not (folder / "config.json").exists():
        raise NothingToRegisterError(f"{folder}: method is full but there is no config.json")


TOKENIZER_FILE = "tokenizer_config.json"


@dataclass(frozen=True)
class ModelFolders:
    """What to log: the weights (final/ or a checkpoint) and the trained tokenizer's folder."""

    weights: Path
    tokenizer: Path
    selected: Selected


def selected_folders(cfg: TrainerConfig, final: Path) -> ModelFolders:
    """What ``spec.registration.select`` picks, checked as final/ is; a checkpoint saved without
    the tokenizer takes final/'s (the same trained tokenizer: training never changes it after the
    start)."""
    selected = select_for_registration(cfg.output_dir, str(cfg.spec.registration.select))
    folder = Path(selected.path)
    if folder == final:
        return ModelFolders(final, final, selected)
    if not (folder / COMPLETE_MARKER).exists():
        raise NothingToRegisterError(f"{folder} ({selected.label}) has no {COMPLETE_MARKER} marker")
    _check_weights(cfg, folder)
    tokenizer = folder if (folder / TOKENIZER_FILE).exists() else final
    if tokenizer == final:
        log.warning("%s has no tokenizer; using the trained tokenizer of %s", folder, final)
    log.info("registering %s (spec.registration.select %s)", folder, cfg.spec.registration.select)
    return ModelFolders(folder, tokenizer, selected)


# --- the final model ------------------------------------------------------------------------------------


def _torch_dtype(cfg: TrainerConfig) -> Any:
    import torch

    # Log in the precision the model was trained in: bf16 halves the artifact against fp32.
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        str(cfg.spec.training.precision)
    ]


@dataclass
class LoadedModel:
    components: dict[str, Any]
    torch_dtype: Any
    base_model_path: str | None  # set when MLflow should reference a base on a volume (merge off)
    merged: bool


def load_final_model(cfg: TrainerConfig, final: Path, tokenizer_dir: Path | None = None) -> LoadedModel:
    """The model to log (from final/ or a checkpoint): full weights, the base with the adapter
    merged, or the PEFT model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = cfg.spec
    trust = spec.model.trust_remote_code
    dtype = _torch_dtype(cfg)
    # The tokenizer saved with the final model is the trained one (chat template, pad token).
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or final, trust_remote_code=trust)
    base: Any
    model: Any
    if spec.method == Method.FULL:
        model = AutoModelForCausalLM.from_pretrained(final, dtype=dtype, trust_remote_code=trust)
        return LoadedModel({"model": model, "tokenizer": tokenizer}, dtype, None, merged=False)

    from peft import PeftModel

    # the model the preparation step put on the volume (offline), the spec's path, or the Hub
    where, kwargs = model_source(cfg)
    log.info("loading base model from %s", where)
    base = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, trust_remote_code=trust, **kwargs)
    if len(tokenizer) > base.get_input_embeddings().num_embeddings:
        # Training added chat tokens and grew the embeddings the same way (kubetune_trainer.sources.chat).
        base.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)
    model = PeftModel.from_pretrained(base, final)
    merge = spec.registration.merge_lora
    if merge:
        log.info("merging the LoRA adapter into the base model")
        model = model.merge_and_unload()
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.eos_token_id = gen.eos_token_id if gen.eos_token_id is not None else tokenizer.eos_token_id
        gen.pad_token_id = gen.pad_token_id if gen.pad_token_id is not None else tokenizer.pad_token_id
    base_model_path = None if merge or spec.model.name else where  # a chained job's: its starting model
    return LoadedModel({"model": model, "tokenizer": tokenizer}, dtype, base_model_path, merged=merge)


def pip_requirements(peft: bool) -> list[str]:
    """Pinned requirements from this environment (MLflow's inference would load the model again)."""
    from importlib.metadata import PackageNotFoundError, version

    names = ["mlflow", "transformers", "torch", "tokenizers", "safetensors", "accelerate"]
    if peft:
        names.append("peft")
    out = []
    for name in names:
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            continue
    return out


# --- the MLflow steps -------------------------------------------------------------------------------------


class Registration:
    def __init__(
        self,
        cfg: TrainerConfig,
        tracking_uri: str,
        retrier: Retrier,
        claim: RegistrationClaim | None = None,
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.cfg = cfg
        self.output_dir = Path(cfg.output_dir)
        self.tracking_uri = tracking_uri
        self.registry_uri = resolve_registry_uri(cfg, tracking_uri)
        self.retry = retrier
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=self.registry_uri)
        self.lineage = lineage_tags(cfg)
        self.name = cfg.registered_model_name
        self.claim = claim

    def _still_claimed(self, what: str) -> None:
        """Before each MLflow write that creates something: this process still holds the claim."""
        if self.claim is not None:
            self.claim.verify(what)

    # run ----------------------------------------------------------------------------------------

    def resolve_run(self) -> str:
        """The training run (from mlflow-run.json), or this job's run found by tags, or a new one."""
        job_run = JobRun(self.cfg, self.tracking_uri, self.client, self.retry.call)
        found = job_run.find()
        if found.from_file:
            log.info("logging into the training run %s", found.run_id)
            return str(found.run_id)
        run_id = found.run_id
        if run_id is None:
            self._still_claimed("create a run")
            run_id = job_run.create(found.experiment_id)
            log.warning("training left no MLflow run (was MLflow down?); created run %s", run_id)
            self.retry.call("end the run", self.client.set_terminated, run_id, "FINISHED")
        job_run.remember(run_id, found.experiment_id)
        return run_id

    # version ----------------------------------------------------------------------------------

    def find_version(self, run_id: str) -> Any | None:
        """This job's READY model version of this run, if registration already happened."""
        versions = self.client.search_model_versions(f"run_id = '{run_id}'")
        mine = [
            v
            for v in versions
            if v.name == self.name and v.status == "READY" and same_job(dict(v.tags or {}), self.lineage)
        ]
        return min(mine, key=lambda v: int(v.version)) if mine else None

    def _job_models(self, run_id: str) -> list[Any]:
        """The models this job logged into the run, in any state."""
        experiment_id = self.client.get_run(run_id).info.experiment_id
        models = self.client.search_logged_models(
            [experiment_id], filter_string=f"source_run_id = '{run_id}'"
        )
        return [
            m for m in models if m.name == MODEL_NAME_IN_RUN and same_job(dict(m.tags or {}), self.lineage)
        ]

    def find_logged_model(self, run_id: str) -> Any | None:
        """This job's finished logged model in the run (logged, maybe never registered)."""
        from mlflow.entities import LoggedModelStatus

        mine = [m for m in self._job_models(run_id) if m.status == LoggedModelStatus.READY]
        return min(mine, key=lambda m: m.creation_timestamp) if mine else None

    def discard_unfinished_models(self, run_id: str) -> None:
        """Delete this job's logged models of the run that never finished uploading (``PENDING``).

        Only under the claim: a holder killed while it logged the model left them, and no other
        process writes them now. Without a claim one may be another process's upload in progress.
        """
        from mlflow.entities import LoggedModelStatus

        if self.claim is None or not self.claim.exclusive:
            return
        for model in self._job_models(run_id):
            if model.status == LoggedModelStatus.PENDING:
                log.warning(
                    "deleting logged model %s of run %s: an earlier registration stopped while uploading it",
                    model.model_id,
                    run_id,
                )
                self._still_claimed("delete an unfinished logged model")
                self.client.delete_logged_model(model.model_id)

    def log_model(self, run_id: str, loaded: LoadedModel) -> str:
        """Log the model into the run; returns its ``models:/<model_id>`` URI."""
        import mlflow

        existing = self.find_logged_model(run_id)
        if existing is not None:
            log.info("reusing logged model %s of run %s", existing.model_id, run_id)
            return f"models:/{existing.model_id}"
        spec = self.cfg.spec
        # MLflow files the logged model under the active experiment, not the run's: without this,
        # it lands in "Default" and a retry would not find it in the run's experiment.
        mlflow.set_experiment(experiment_id=self.client.get_run(run_id).info.experiment_id)
        self._still_claimed("log the model")
        log.info("logging the model into run %s (this uploads its weights)", run_id)
        info = mlflow.transformers.log_model(
            transformers_model=loaded.components,
            name=MODEL_NAME_IN_RUN,
            task=TASK,
            torch_dtype=loaded.torch_dtype,
            base_model_path=loaded.base_model_path,
            pip_requirements=pip_requirements(peft=spec.method == Method.LORA and not loaded.merged),
            metadata={
                "task": TASK,
                "pretrained_model_name": spec.model.name or str(spec.model.path),
                "kubetune_method": str(spec.method),
            },
            tags=self.lineage,
            run_id=run_id,
        )
        return str(info.model_uri)

    def register(self, run_id: str, model_uri: str, tags: dict[str, str] | None = None) -> Any:
        """Create the model version (lineage and ``tags``), unless an earlier attempt already did."""
        import mlflow

        existing = self.find_version(run_id)
        if existing is not None:
            return existing
        mlflow.set_registry_uri(self.registry_uri)
        self._still_claimed("create a model version")
        return mlflow.register_model(
            model_uri,
            self.name,
            await_registration_for=AWAIT_REGISTRATION_S,
            tags={**self.lineage, **(tags or {})},
        )

    def log_gate(self, run_id: str, verdict: Verdict) -> None:
        """The gate's numbers as metrics of the run (step 0); nothing without a gate."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, value, now, 0) for key, value in verdict.metrics().items()]
        if batch:
            self.retry.call("log the gate's numbers", self.client.log_batch, run_id, metrics=batch)

    # the whole step ---------------------------------------------------------------------------------

    def run(self, folders: ModelFolders, verdict: Verdict) -> dict[str, Any]:
        """Register what was selected (once), or raise :class:`GateNotMetError`."""
        import mlflow

        mlflow.set_tracking_uri(self.tracking_uri)
        run_id = self.resolve_run()
        version = self.retry.call(f"look up versions of {self.name!r}", self.find_version, run_id)
        if version is not None:
            log.info("already registered: %s version %s (from run %s)", self.name, version.version, run_id)
            # a version forced past the gate stays forced (an alias move runs without --force)
            if (version.tags or {}).get(TAG_FORCED) == "true" and verdict.passed is False:
                verdict = replace(verdict, forced=True)
        else:
            self.log_gate(run_id, verdict)
            if verdict.blocks:
                raise GateNotMetError(verdict)
            log.info("%s", verdict.message())
            self.retry.call("discard unfinished logged models", self.discard_unfinished_models, run_id)
            logged = self.retry.call("look up logged models", self.find_logged_model, run_id)
            if logged is not None:
                model_uri = f"models:/{logged.model_id}"
                log.info("model %s was logged but not registered; registering it", logged.model_id)
            else:
                loaded = load_final_model(self.cfg, folders.weights, folders.tokenizer)
                model_uri = self.retry.call("log the model", self.log_model, run_id, loaded)
            version = self.retry.call(
                f"register {self.name!r}", self.register, run_id, model_uri, verdict.tags()
            )
            log.info("registered %s version %s from %s", self.name, version.version, model_uri)
        version_id = str(version.version)
        alias = self.cfg.spec.registration.alias
        self.retry.call("point the alias", self.point_alias, version_id, alias)
        self._tag_run(run_id, version_id)
        experiment_id = self.retry.call("read the run", self.client.get_run, run_id).info.experiment_id
        result: dict[str, Any] = {
            "name": self.name,
            "version": version_id,
            "uri": f"models:/{self.name}/{version_id}",
            "run_id": run_id,
            "alias": alias,
            "selected": verdict.selected,
            "evaluation": verdict.status(),
        }
        links = {
            "url": model_version_url(self.registry_uri, self.name, version_id),
            "run_url": run_url(self.tracking_uri, str(experiment_id), run_id),
        }
        return {**result, **{k: v for k, v in links.items() if v}}

    def point_alias(self, version_id: str, alias: str | None) -> None:
        """Point ``alias`` at this version; drop the alias kubetune set before, if it changed.

        ``registration.alias`` may change after the model was registered: the registration runs
        again and moves the alias. Only the alias kubetune itself set (recorded in a version tag)
        is removed, and only while it still points at this version; aliases people set by hand,
        or that moved on to another version since, are left alone.
        """
        current = self.client.get_model_version(self.name, version_id)
        previous = (current.tags or {}).get(TAG_ALIAS)
        if previous and previous != alias and previous in (current.aliases or []):
            log.info(
                "removing alias %r from %s version %s (registration.alias is now %r)",
                previous,
                self.name,
                version_id,
                alias,
            )
            self.client.delete_registered_model_alias(self.name, previous)
        if alias:
            self.client.set_registered_model_alias(self.name, alias, version_id)
            self.client.set_model_version_tag(self.name, version_id, TAG_ALIAS, alias)
        elif previous:
            self.client.delete_model_version_tag(self.name, version_id, TAG_ALIAS)

    def _tag_run(self, run_id: str, version: str) -> None:
        from mlflow.entities import RunTag

        tags = {**self.lineage, TAG_REGISTERED_MODEL: f"{self.name}/{version}"}
        batch = [RunTag(k, v) for k, v in tags.items()]
        self.retry.call("tag the run", self.client.log_batch, run_id, tags=batch)


# --- results ----------------------------------------------------------------------------------------------


def termination_message(data: dict[str, Any]) -> str:
    """Compact JSON under the kubelet's 4096-byte limit (a long error message is cut)."""
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) <= TERMINATION_MESSAGE_LIMIT or "error" not in data:
        return text
    overflow = len(text.encode()) - TERMINATION_MESSAGE_LIMIT + 20
    cut = {**data, "error": str(data["error"])[: max(0, len(str(data["error"])) - overflow)] + "..."}
    return json.dumps(cut, separators=(",", ":"), sort_keys=True)


def write_termination_message(data: dict[str, Any], path: str | None) -> None:
    """Write to the explicit path (``--termination-message-path``), or to /dev/termination-log where
    the kubelet provides it."""
    explicit = path is not None
    target = Path(path or DEFAULT_TERMINATION_MESSAGE_PATH)
    if not explicit and not target.exists():
        # Not in a Kubernetes container: never create files under /dev on a laptop.
        return
    try:
        target.write_text(termination_message(data))
    except OSError as exc:
        log.warning("could not write the termination message to %s: %s", target, exc)


# --- the entry point --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kubetune_trainer.register",
        description="Register the trained model of a FineTuneJob in MLflow (idempotent).",
    )
    p.add_argument(
        "--config", required=True, type=Path, help="trainer config (YAML) rendered by the operator"
    )
    p.add_argument(
        "--retry-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"give up once MLflow has been unreachable this long in total (default: {DEFAULT_RETRY_BUDGET_S:g})",
    )
    p.add_argument(
        "--termination-message-path",
        default=None,
        help=f"where to write the JSON result for the operator (default: {DEFAULT_TERMINATION_MESSAGE_PATH} "
        "when it exists)",
    )
    p.add_argument(
        "--claim-wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"how long to wait while another registration of the same output folder runs "
        f"(default: {DEFAULT_CLAIM_WAIT_S:g})",
    )
    p.add_argument("--tracking-uri", default=None, help="override the config's MLflow tracking URI")
    p.add_argument(
        registration_contract.FORCE_FLAG,
        action="store_true",
        default=False,
        help="register even when spec.registration.gate is not met (tagged kubetune.gate.forced=true; the "
        "operator passes it for a kubetune.io/retry-registration; never read from the environment)",
    )
    return p


def _fail(code: int, reason: str, message: str, term_path: str | None) -> int:
    message = redact(message)
    print(f"kubetune register: error: {message}", file=sys.stderr)
    write_termination_message({"error": message, "reason": reason}, term_path)
    return code


def main(argv: list[str] | None = None) -> int:
    skip_unused_libraries()
    share_cpus()
    args = build_parser().parse_args(argv)
    # Libraries print too (MLflow prints run URLs): what reaches the pod log is redacted as well.
    with redacted_stdio():
        return _register(args)


# The failures that end a registration: (exception, exit code, reason for the operator); the first
# that matches counts. A ClaimError's reason is its own.
_FAILURES: tuple[tuple[type[Exception], int, str], ...] = (
    (NothingToRegisterError, EXIT_NOTHING_TO_REGISTER, "NothingToRegister"),
    (ClaimError, EXIT_ERROR, "ClaimError"),
    (MlflowRefusedError, EXIT_REFUSED, "MlflowRefused"),
    (MlflowUnavailableError, EXIT_UNAVAILABLE, "MlflowUnavailable"),
    (MlflowError, EXIT_ERROR, "RegistrationFailed"),
)


def _register(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    settings.warn_ignored_control(log, "register")
    budget = args.retry_budget if args.retry_budget is not None else DEFAULT_RETRY_BUDGET_S
    claim_wait = args.claim_wait if args.claim_wait is not None else DEFAULT_CLAIM_WAIT_S
    term_path = args.termination_message_path

    try:
        cfg = TrainerConfig.load(args.config)
    except (OSError, ValueError) as exc:  # missing file, bad YAML, or a spec that does not validate
        return _fail(
            EXIT_ERROR, "InvalidConfig", f"cannot read the trainer config {args.config}: {exc}", term_path
        )
    if not cfg.spec.registration.enabled:
        log.info("registration is disabled in the spec (registration.enabled: false); nothing to do")
        # the operator tells a Job that skipped from one that registered (turned off while it ran)
        write_termination_message({"skipped": "registration.enabled is false"}, term_path)
        return EXIT_OK
    tracking_uri = resolve_tracking_uri(cfg, args.tracking_uri)
    configure_mlflow_http()
    # The model's requirements are pinned above; the uv project in the current directory (the
    # image's, or a developer's checkout) says nothing about the model, and MLflow would copy it in.
    os.environ.setdefault("MLFLOW_UV_AUTO_DETECT", "false")
    force = bool(args.force)  # the command line only (the operator's, or a local run's)
    try:
        result = _register_under_claim(cfg, tracking_uri, budget, claim_wait, force=force)
    except GateNotMetError as exc:
        return _gate_not_met(exc, cfg, term_path)
    except Exception as exc:
        return _failed(exc, tracking_uri, term_path)
    dump_json(result, Path(cfg.output_dir) / REGISTER_RESULT_FILE)
    write_termination_message(result, term_path)
    print(json.dumps(result, sort_keys=True))
    log.info("registered %s (run %s)", result["uri"], result["run_id"])
    return EXIT_OK


def _register_under_claim(
    cfg: TrainerConfig, tracking_uri: str, budget: float, claim_wait: float, *, force: bool = False
) -> dict[str, Any]:
    final = final_dir(cfg)
    folders = selected_folders(cfg, final)
    verdict = decide(
        cfg.spec.registration.gate,
        folders.selected.label,
        folders.selected.eval_loss,
        base_eval_loss(cfg.output_dir),
        forced=force,
    )
    retrier = Retrier(tracking_uri=tracking_uri, budget_s=budget)
    with RegistrationClaim(Path(cfg.output_dir), claim_wait) as claim:
        registration = Registration(cfg, tracking_uri, retrier, claim)
        install_log_redaction()  # MLflow and transformers added their handlers on import
        return registration.run(folders, verdict)


def _gate_not_met(exc: GateNotMetError, cfg: TrainerConfig, term_path: str | None) -> int:
    """Nothing registered: the verdict (both numbers) to register-result.json and the termination
    message, exit code ``EXIT_GATE_NOT_MET``."""
    data = {"reason": REASON_GATE_NOT_MET, "error": str(exc), "evaluation": exc.verdict.status()}
    dump_json(data, Path(cfg.output_dir) / REGISTER_RESULT_FILE)
    write_termination_message(data, term_path)
    print(f"kubetune register: {REASON_GATE_NOT_MET}: {exc}", file=sys.stderr)
    print(
        "kubetune register: to register it anyway: --force; in a cluster, "
        "set the kubetune.io/retry-registration annotation",
        file=sys.stderr,
    )
    return EXIT_GATE_NOT_MET


def _failed(exc: Exception, tracking_uri: str, term_path: str | None) -> int:
    """The exit code and termination message of a registration that raised ``exc``."""
    for kind, code, reason in _FAILURES:
        if isinstance(exc, kind):
            said = exc.reason if isinstance(exc, ClaimError) else reason
            return _fail(code, said, str(exc), term_path)
    log.error("registration failed", exc_info=exc)
    message = f"{type(exc).__name__}: {exc} (tracking URI {redact(tracking_uri)})"
    return _fail(EXIT_ERROR, "RegistrationFailed", message, term_path)
