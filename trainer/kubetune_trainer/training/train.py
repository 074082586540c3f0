"""Fine-tune a causal LM as a FineTuneJob says: TRL SFTTrainer, LoRA or full, resumable, tracked.

Launched by ``torchrun`` in each PyTorchJob pod (one process per GPU), or as a plain process::

    torchrun --nproc_per_node 8 -m kubetune_trainer.train --config /etc/kubetune/config.yaml
    python -m kubetune_trainer.train --config runs/tiny/config.yaml     # one process, CPU or GPU

What it does, in order: check the data (:mod:`kubetune_trainer.sources.data_check`: every row of local
files, and the data's identity), refuse a folder of another training or of other data, clean up
checkpoints whose save was cut short, load the data (Hub id or JSONL/JSON/Parquet file or folder;
chat ``messages``, prompt/completion or text), open (or re-open) the job's MLflow run on rank 0,
decide the plan for this hardware (:mod:`kubetune_trainer.plan.plan`), load the base model and tokenizer
(ChatML template and pad token when missing, as the notebooks do), train with TRL's SFTTrainer from
the newest complete checkpoint, and write the final model (adapter or full weights + tokenizer) to
``<output_dir>/final`` with its COMPLETE marker, and ``train-result.json`` (the whole run, across
attempts: the resumed checkpoint carries the loss history).

Exit codes: 0 trained (or already trained); 143 (``EXIT_PREEMPTED``) SIGTERM arrived, a checkpoint
was saved, run again to continue; 2 (``EXIT_BAD_INPUT``) bad data or config, or the output folder
holds another training's checkpoints or final model, or this training's on other data (nothing is
touched; one message, no traceback unless ``--debug``); anything else failed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubetune_api.failures import Failure, TrainingFailure
from kubetune_api.trainer_config import (
    EXIT_PREEMPTED,
    FINAL_DIR,
    TRAIN_RESULT_FILE,
    TrainerConfig,
)
from kubetune_api.tuning import GPU_MEMORY_ENV

from .. import settings
from ..mlflow.client import install_log_redaction, redacted_stdio
from ..mlflow.tracking import MlflowTracker
from ..plan import plan as run_plan
from ..process import Dist, load_config, setup_logging, share_cpus, skip_unused_libraries
from ..sources.chat import ensure_chat_format
from ..sources.data_check import EXIT_BAD_INPUT, BadInputError, DataCheck
from ..volume import catalog, checkpoints, resume
from . import evaluation, failures, oom, quantization
from .build import (
    build_config,
    build_datasets,
    build_model,
    build_peft_config,
    build_sft_config,  # noqa: F401 (kubetune_trainer.training.train.build_sft_config: the bench and tests)
    build_tokenizer,
    build_trainer,
    check_data,
    model_shape,
    plan_training,
)
from .ledger import Ledger, process_start_time
from .preemption import PreemptionGuard, barrier
from .progress import ProgressReporter, in_cluster_patcher
from .result import TrainResult, earlier_history, finished_earlier, mean_loss
from .watchdog import LossWatchdog

log = logging.getLogger("kubetune_trainer.train")

# --- the run ---------------------------------------------------------------------------------------


# The output folder holds a complete checkpoint or final model of another training (or of other data)
EXIT_OTHER_TRAINING = EXIT_BAD_INPUT


def other_training(path: Path | None, cfg: TrainerConfig, data_hash: str | None = None) -> str | None:
    """Why ``path`` (a final model or checkpoint folder) must not be resumed or taken as this run's
    result: its COMPLETE marker names another training, or the same training on other data. None:
    the same training on the same data, no marker, or a marker older than the check (no
    ``training_hash`` or no ``data_hash``: kept working as before)."""
    if path is None:
        return None
    written = checkpoints.marked_training(path)
    ours = cfg.training_hash()
    fix = (
        f"Use a new output folder (kubetune run --output-dir, or a new storage claim in a cluster), "
        f"or delete {cfg.output_dir} to start over."
    )
    if written and written != ours:
        return (
            f"{path} was written by another training (model, data, method or hyperparameters differ: "
            f"training hash {written}, this run's {ours}); resuming from it, or taking it as "
            f"this run's result, would mix the two. {fix}"
        )
    written_data = checkpoints.marked_data(path)
    if written and written_data and data_hash and written_data != data_hash:
        src = cfg.spec.dataset
        return (
            f"{path} was written by this training on other data: the content of {src.path or src.name} "
            f"changed since (data hash {written_data}, now {data_hash}); resuming from it, or taking it "
            f"as this run's result, would mix the two. {fix}"
        )
    return None


@dataclass
class Outcome:
    status: str  # succeeded | preempted | already-complete | refused | failed
    exit_code: int
    result: dict[str, Any] = field(default_factory=dict)
    failure: TrainingFailure | None = None  # refused or failed: why, for the termination message


def write_final(trainer: Any, tokenizer: Any, final_dir: Path, dist: Dist, info: dict[str, Any]) -> None:
    """Write the trained model + tokenizer to ``final/``, then (rank 0) its COMPLETE marker."""
    import shutil

    # Training ran without a KV cache (it also keeps the packed-sequence mask on); generation wants it.
    trainer.model.config.use_cache = True
    if dist.is_rank0 and final_dir.exists():
        # A previous attempt died while writing it: never mix old and new files.
        shutil.rmtree(final_dir)
    barrier()
    # save_model gathers what it needs from every rank (and writes on rank 0 only).
    trainer.save_model(str(final_dir))
    if dist.is_rank0:
        tokenizer.save_pretrained(str(final_dir))
    barrier()
    if dist.is_rank0:
        checkpoints.mark_complete(final_dir, info)
    barrier()


def _refuse(message: str, guard: Any, *, debug: bool = False, data: bool = False) -> Outcome:
    log.error("%s", message, exc_info=debug)
    guard.uninstall()
    why = TrainingFailure.of(Failure.DATASET_ERROR if data else Failure.UNKNOWN, message)
    return Outcome("refused", EXIT_BAD_INPUT, {"error": message}, failure=why)


def run(
    cfg: TrainerConfig,
    *,
    progress_bar: bool | None = None,
    ctrl_c_saves: bool = False,
    checked: DataCheck | None = None,
    debug: bool = False,
) -> Outcome:
    """Train as ``cfg`` says; the caller turns the outcome into the exit code.

    ``ctrl_c_saves``: treat Ctrl-C (SIGINT) like SIGTERM: checkpoint, stop (for local runs).
    ``checked``: the data pre-check's result when the caller ran it (``kubetune run --local`` does,
    before it builds anything). Bad data or a folder of another training: status ``refused``, exit
    code 2, the message in ``result["error"]`` (and logged; with its traceback when ``debug``).
    """
    # MLflow prints run URLs (the tracking URI with any user:password@ in it) with print()
    with redacted_stdio():
        return _run(cfg, progress_bar=progress_bar, ctrl_c_saves=ctrl_c_saves, checked=checked, debug=debug)


def _run(  # noqa: PLR0911  one return per refusal or end, in the order they happen
    cfg: TrainerConfig,
    *,
    progress_bar: bool | None,
    ctrl_c_saves: bool,
    checked: DataCheck | None,
    debug: bool,
) -> Outcome:
    """Check the data, decide the attempt (:func:`checkpoints.decide_attempt`), load the data, then
    build and train once (:func:`_train_once`) with the job's MLflow run open on rank 0."""
    dist = Dist.from_env()
    setup_logging(dist)
    install_log_redaction()
    started = time.monotonic()
    failures.context.model = cfg.spec.model.name or (
        str(cfg.spec.model.path) if cfg.spec.model.path else None
    )

    try:
        # before anything is written or loaded (torch and transformers included): every row of
        # local data, and the data's identity
        checked = checked or check_data(cfg)
    except BadInputError as e:
        log.error("%s", e, exc_info=debug)
        why = TrainingFailure.of(Failure.DATASET_ERROR, str(e))
        return Outcome("refused", EXIT_BAD_INPUT, {"error": str(e)}, failure=why)

    refused = method_refusal(cfg)
    if refused is not None:  # before anything is written or loaded, bitsandbytes included
        log.error("%s", refused)
        why = TrainingFailure.of(Failure.QUANTIZATION_NOT_SUPPORTED, refused)
        return Outcome("refused", EXIT_BAD_INPUT, {"error": refused}, failure=why)

    guard = PreemptionGuard(ctrl_c=ctrl_c_saves).install()
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    data_hash = checked.data_hash
    attempt = _decide(cfg, output_dir, data_hash, dist)
    if isinstance(attempt, Outcome):
        guard.uninstall()
        return attempt
    if attempt.kind == checkpoints.AttemptKind.REFUSE:
        return _refuse(attempt.refusal or "", guard)
    final_dir = output_dir / FINAL_DIR
    failures.context.output_dir = output_dir
    failures.context.resume_from = attempt.resume.path if attempt.resume else None
    if attempt.kind == checkpoints.AttemptKind.ALREADY_COMPLETE:
        log.info("%s is complete: nothing to train", final_dir)
        guard.uninstall()
        root, result_path = checkpoints.checkpoints_root(output_dir), output_dir / TRAIN_RESULT_FILE
        result = finished_earlier(final_dir, root, result_path) if dist.is_rank0 else {}
        return Outcome("already-complete", 0, {**result, "final_dir": str(final_dir)})

    progress_bar = _progress_bars(progress_bar)
    try:
        # the data before the model: a Hub data set's rows are checked as they load
        data = build_datasets(cfg, checked)
    except BadInputError as e:
        return _refuse(str(e), guard, debug=debug, data=True)
    log.info(
        "data: %d training rows, %s eval rows, format %s, data hash %s",
        len(data[0]),
        len(data[1]) if data[1] is not None else "no",
        data[2],
        data_hash or "unknown",
    )
    ctx = _Attempt(cfg, dist, guard, attempt.resume, checked, started, progress_bar)
    tracker = ctx.open_tracker()
    status = "FAILED"
    try:
        outcome = _train_once(ctx, tracker, data)
        status = "FINISHED" if outcome.status == "succeeded" else "KILLED"
        return outcome
    finally:
        guard.uninstall()
        if tracker is not None:
            tracker.finish(status)


def method_refusal(cfg: TrainerConfig) -> str | None:
    """Why the spec's method cannot run in this process: QLoRA without a GPU of compute capability 8.0
    or newer (:func:`..plan.plan.qlora_refusal`, the rule the preparation applies to the product the
    job names), or without bitsandbytes. None: it can."""
    if not run_plan.method_of(cfg.spec).get("nf4"):
        return None
    hw = run_plan.Hardware.detect()
    where = hw.name or "this machine"
    return run_plan.qlora_refusal(cuda=hw.cuda, capability=hw.capability, where=where) or (
        quantization.missing_library()
    )


def _decide(cfg: TrainerConfig, output_dir: Path, data_hash: str | None, dist: Dist) -> Any:
    """The attempt (:func:`resume.attempt_for`: spec.resume applied on the job's first attempt,
    another training's folder refused), or the refusal of a spec.resume the volume cannot honour."""
    try:
        return resume.attempt_for(
            output_dir,
            cfg.spec.resume,
            cfg.job.uid,
            lambda path: other_training(path, cfg, data_hash),
            rank0=dist.is_rank0,
        )
    except resume.CheckpointNotFoundError as e:
        log.error("%s", e)
        why = TrainingFailure.of(Failure.CHECKPOINT_NOT_FOUND, str(e))
        return Outcome("refused", EXIT_BAD_INPUT, {"error": str(e), "steps": e.steps}, failure=why)


def _progress_bars(wanted: bool | None) -> bool:
    """Whether to show progress bars (default: when stderr is a terminal); off, the libraries' too."""
    if wanted is None:
        wanted = sys.stderr.isatty()
    if not wanted:
        # In a pod the bars are noise in the logs; the per-step log lines tell the story.
        import datasets
        import transformers

        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
    return wanted


@dataclass
class _Attempt:
    """One training attempt: what it was started with."""

    cfg: TrainerConfig
    dist: Dist
    guard: Any
    resume: checkpoints.Checkpoint | None
    checked: DataCheck
    started: float
    progress_bar: bool

    @property
    def output_dir(self) -> Path:
        return Path(self.cfg.output_dir)

    @property
    def result_path(self) -> Path:
        return self.output_dir / TRAIN_RESULT_FILE

    def open_tracker(self) -> Any:
        """The job's MLflow run, opened (or re-opened) on rank 0; None on the other ranks."""
        if not self.dist.is_rank0:
            return None
        tracker = MlflowTracker(self.cfg, self.output_dir)
        extra = {"kubetune.worldSize": str(self.dist.world_size)}
        if self.checked.data_hash:
            extra["kubetune.dataHash"] = self.checked.data_hash
        tracker.start(extra)
        return tracker

    def progress_reporter(self, tracker: Any) -> Any:
        """Who patches the FineTuneJob's status.progress (rank 0 in a cluster); None: nobody."""
        if not (self.cfg.report_progress and self.dist.is_rank0):
            return None
        try:
            patcher = in_cluster_patcher(self.cfg.job.namespace, self.cfg.job.name)
        except Exception as e:  # not in a cluster, no token: report nothing, train anyway
            log.warning("progress reporting off: %s", e)
            return None
        return ProgressReporter(
            patcher, total_steps=0, mlflow=tracker.status if tracker is not None else None
        )


def _plan(cfg: TrainerConfig, retries: list[dict[str, Any]] | None = None) -> Any:
    """The plan for this process's hardware, with the tuning variables read once, here (a bad one:
    ValueError naming it); the GPU memory cap is applied before anything reaches the GPU; the
    layout of the newest retry after CUDA out of memory (:mod:`oom`), if any."""
    tuning = settings.current().tuning()
    hw = run_plan.Hardware.detect(tuning)
    fraction = run_plan.limit_gpu_memory(tuning)
    if fraction is not None:
        log.info("GPU memory capped at %.0f%% of the GPU (%s)", 100 * fraction, GPU_MEMORY_ENV)
    plan = run_plan.make_plan(
        plan_training(cfg), hw, shape=model_shape(cfg), tuning=tuning, **run_plan.method_of(cfg.spec)
    )
    plan = oom.apply(plan, retries or [])
    for what, why in plan.reasons.items():
        log.info("plan: %s: %s", what, why)
    return plan, tuning


def _train_once(attempt: _Attempt, tracker: Any, data: tuple[Any, Any, str]) -> Outcome:
    """Build the model and trainer, train from the attempt's checkpoint, then report: the final
    model and a succeeded result (also when the budget stopped it), a preempted one (SIGTERM), or
    the classified failure (a CUDA out-of-memory one recorded for a leaner retry)."""
    cfg, dist, resume = attempt.cfg, attempt.dist, attempt.resume
    train_ds, eval_ds, fmt = data
    retries = oom.load(attempt.output_dir)
    plan, tuning = _plan(cfg, retries)
    layout = oom.Layout.of(plan)
    failures.context.layout = str(layout)
    ledger = Ledger.load(attempt.output_dir, dist.world_size) if dist.is_rank0 else None
    if ledger is not None:
        ledger.begin(started=process_start_time(), resumed_step=resume.step if resume else 0)
        ledger.save(force=True)  # an attempt killed while loading (host OOM, preemption) still counts
    reporter = attempt.progress_reporter(tracker)

    def extra_status() -> dict[str, Any]:
        out: dict[str, Any] = {"memoryRetries": oom.public(oom.load(attempt.output_dir)) or None}
        if reporter is not None:  # status.progress.baseEvalLoss (status.evaluation is the operator's)
            reporter.state.base_eval_loss = catalog.base_eval_loss(attempt.output_dir)
        if ledger is not None:
            out["goodput"] = ledger.goodput()
        return out

    try:
        return _fit(attempt, tracker, (train_ds, eval_ds, fmt), plan, tuning, ledger, reporter, extra_status)
    except Exception as e:
        failure = failures.classify(e)
        if failure.reason == Failure.CUDA_OUT_OF_MEMORY:
            failure = _memory_retry(attempt, failure, layout, len(retries))
        if reporter is not None:
            if ledger is not None:
                ledger.save(force=True)
            reporter.state.extra = extra_status()
            reporter.report(force=True)
        return Outcome("failed", failure.exit_code, {"error": failure.message}, failure=failure)


def _callback(
    attempt: _Attempt, tracker: Any, reporter: Any, plan: Any, ledger: Ledger | None, extra_status: Any
) -> Any:
    """The run's hooks: checkpoints, metrics, progress, the loss watchdog, the budget and the ledger."""
    from .callbacks import RunCallback

    cfg, dist = attempt.cfg, attempt.dist
    earlier_losses, earlier_evals = earlier_history(attempt.resume, attempt.result_path)
    return RunCallback(
        earlier_losses=earlier_losses,
        earlier_eval_losses=earlier_evals,
        checkpoints_root=checkpoints.checkpoints_root(attempt.output_dir),
        save_total_limit=cfg.spec.training.save_total_limit,
        guard=attempt.guard,
        tracker=tracker,
        progress=reporter,
        is_rank0=dist.is_rank0,
        world_size=dist.world_size,
        training_hash=cfg.training_hash(),
        data_hash=attempt.checked.data_hash,
        watchdog=LossWatchdog(cfg.spec.training.loss_watchdog) if dist.is_rank0 else None,
        ledger=ledger,
        budget=cfg.spec.budget,
        micro_rows=plan.per_device_batch_size,
        extra_status=extra_status,
    )


def _memory_retry(attempt: _Attempt, failure: TrainingFailure, layout: Any, retried: int) -> TrainingFailure:
    """After CUDA out of memory: record a leaner layout for the next attempt (retryable), unless the
    retries are spent or there is no leaner layout (then the failure is final)."""
    allowed = attempt.cfg.spec.training.oom_retries
    nxt = oom.leaner(layout)
    if retried >= allowed or nxt is None:
        why = (
            f"no retry left (spec.training.oomRetries {allowed})"
            if retried >= allowed
            else "1 row per micro-step with recomputation is the leanest layout"
        )
        return failure.model_copy(update={"retryable": False, "message": f"{failure.message}; {why}"})
    if len(oom.load(attempt.output_dir)) == retried:  # another rank may have recorded it already
        oom.record(attempt.output_dir, failure.step, layout, nxt)
    return failure.model_copy(
        update={
            "retryable": True,
            "message": f"{failure.message}; retry {retried + 1} of {allowed} resumes from the newest "
            f"checkpoint with {nxt} (was {layout}; the same rows per optimizer step)",
        }
    )


def _fit(
    attempt: _Attempt,
    tracker: Any,
    data: tuple[Any, Any, str],
    plan: Any,
    tuning: Any,
    ledger: Ledger | None,
    reporter: Any,
    extra_status: Any,
) -> Outcome:
    cfg, dist, resume = attempt.cfg, attempt.dist, attempt.resume
    train_ds, eval_ds, fmt = data
    tokenizer = build_tokenizer(cfg)
    model = build_model(cfg, plan, varlen_kernel=tuning.varlen_kernel)
    ensure_chat_format(model, tokenizer)
    args = build_config(
        cfg, plan, has_eval=eval_ds is not None, progress_bar=attempt.progress_bar, tuning=tuning
    )
    callback = _callback(attempt, tracker, reporter, plan, ledger, extra_status)
    trainer = build_trainer(
        model,
        tokenizer,
        args,
        train=train_ds,
        evaluation=eval_ds,
        peft=build_peft_config(cfg),
        callbacks=[callback],
        plan=plan,
        cfg=cfg,
    )
    if reporter is not None:
        reporter.state.total_steps = _planned_steps(trainer)
    result = TrainResult(status="preempted", world_size=dist.world_size, plan=plan.as_dict())
    if attempt.guard.agreed() and attempt.guard.budget_limit is None:
        # SIGTERM while loading: nothing new to save, the next attempt starts where this one did.
        if ledger is not None:
            ledger.on_preempted()
            ledger.save(force=True)
        return _report(attempt, tracker, _preempted(result, callback, resume, attempt))
    if resume is not None:
        log.info("resuming from %s (step %d)", resume.path, resume.step)
    evaluation.base_eval(trainer, cfg, resumed=resume is not None, is_rank0=dist.is_rank0, tracker=tracker)
    train_output = trainer.train(resume_from_checkpoint=str(resume.path) if resume else None)
    if callback.preempted_at_step is not None:
        return _report(attempt, tracker, _preempted(result, callback, resume, attempt))
    final_dir = attempt.output_dir / FINAL_DIR
    write_final(trainer, tokenizer, final_dir, dist, _final_info(attempt, trainer, callback))
    result = _succeeded(result, callback, trainer, train_output, attempt, fmt)
    if callback.budget_stop is not None:
        step, limit = callback.budget_stop
        planned = reporter.state.total_steps if reporter is not None else trainer.state.max_steps
        result.budget = {"reached": True, "limit": limit, "step": step, "totalSteps": planned}
        log.info(
            "budget reached (%s): stopped at step %d of %d; the final model is step %d's",
            limit,
            step,
            planned,
            step,
        )
    if ledger is not None:
        ledger.save(force=True)
        result.goodput = ledger.goodput()
    if reporter is not None:
        reporter.state.extra = {**extra_status(), "budget": result.budget}
        reporter.report(force=True)
    if tracker is not None:
        if result.train_loss is not None:
            tracker.log_metrics({"final_train_loss": result.train_loss}, trainer.state.global_step)
        tags = {"kubetune.final_dir": str(final_dir)}
        if result.budget:
            tags["kubetune.budget_reached"] = result.budget["limit"]
        tracker.set_tags(tags)
    return _report(attempt, tracker, result)


def _final_info(attempt: _Attempt, trainer: Any, callback: Any) -> dict[str, Any]:
    """final/COMPLETE's fields: the step, the final model's eval loss (evaluated now when the last
    evaluation was not at the final step), what training it is, and the budget that stopped it."""
    cfg = attempt.cfg
    info: dict[str, Any] = {
        "step": trainer.state.global_step,
        "method": str(cfg.spec.method),
        "config_hash": cfg.config_hash(),
        "training_hash": cfg.training_hash(),
        "eval_loss": evaluation.final_eval(trainer),
    }
    if attempt.checked.data_hash:
        info["data_hash"] = attempt.checked.data_hash
    if callback.budget_stop is not None:
        info["budget"] = callback.budget_stop[1]
    return info


def _succeeded(
    result: TrainResult, callback: Any, trainer: Any, train_output: Any, attempt: _Attempt, fmt: str
) -> TrainResult:
    resume, root = attempt.resume, checkpoints.checkpoints_root(attempt.output_dir)
    result.status = "succeeded"
    result.global_step = trainer.state.global_step
    result.planned_steps = trainer.state.max_steps
    result.steps_this_attempt = trainer.state.global_step - (resume.step if resume else 0)
    result.epoch = trainer.state.epoch
    result.losses, result.eval_losses = callback.losses, callback.eval_losses
    # transformers' training_loss divides this attempt's losses by every attempt's steps
    result.train_loss = train_output.training_loss if resume is None else mean_loss(callback.losses)
    result.resumed_from = str(resume.path) if resume else None
    result.resumed_from_step = resume.step if resume else None
    result.final_dir = str(attempt.output_dir / FINAL_DIR)
    result.checkpoints = [str(c.path) for c in checkpoints.complete_checkpoints(root)]
    result.data_format, result.data_hash = fmt, attempt.checked.data_hash
    result.tokens_per_second = callback.tokens_per_second
    return result


def _preempted(
    result: TrainResult, callback: Any, resume: checkpoints.Checkpoint | None, attempt: _Attempt
) -> TrainResult:
    # the run so far, across attempts: where the next attempt resumes
    latest = checkpoints.latest_complete(checkpoints.checkpoints_root(attempt.output_dir))
    result.preempted_at_step = callback.preempted_at_step
    result.global_step = latest.step if latest else None
    result.latest_checkpoint = str(latest.path) if latest else None
    result.latest_checkpoint_step = latest.step if latest else None
    result.resumed_from = str(resume.path) if resume else None
    result.resumed_from_step = resume.step if resume else None
    result.losses, result.eval_losses = callback.losses, callback.eval_losses
    return result


def _report(attempt: _Attempt, tracker: Any, result: TrainResult) -> Outcome:
    """The attempt's outcome; rank 0 writes train-result.json (with the MLflow run) and says so."""
    result.seconds = round(time.monotonic() - attempt.started, 1)
    if attempt.dist.is_rank0:
        result.mlflow = tracker.result() if tracker else {}
        result.write(attempt.result_path)
        if result.status == "succeeded":
            log.info(
                "trained %d steps; loss %s -> %s; final model in %s",
                result.global_step,
                result.first_loss,
                result.final_loss,
                result.final_dir,
            )
        else:
            log.warning(
                "preempted: checkpoint %s saved; exiting %d so that the run is retried",
                result.latest_checkpoint,
                EXIT_PREEMPTED,
            )
    if result.status == "succeeded":
        return Outcome("succeeded", 0, result.as_dict())
    return Outcome("preempted", EXIT_PREEMPTED, result.as_dict())


def _planned_steps(trainer: Any) -> int:
    """Optimizer steps the run will take (max_steps, or epochs x batches per epoch)."""
    args = trainer.args
    if args.max_steps and args.max_steps > 0:
        return int(args.max_steps)
    import math

    batches = len(trainer.get_train_dataloader())
    per_epoch = max(1, math.ceil(batches / args.gradient_accumulation_steps))
    return math.ceil(per_epoch * args.num_train_epochs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kubetune_trainer.train", description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, required=True, help="trainer config YAML (TrainerConfig)")
    p.add_argument(
        "--progress-bar",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--debug", action="store_true", help="show the traceback of a bad-input error (bad data, bad config)"
    )
    p.add_argument(
        failures.TERMINATION_LOG_FLAG,
        type=Path,
        default=None,
        metavar="FILE",
        help=f"where a failure's one-line report goes (default: {failures.DEFAULT_TERMINATION_LOG}, "
        "the kubelet's file, when it exists; never from the environment)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    skip_unused_libraries(float8=settings.current().float8_asked)
    share_cpus()
    args = build_parser().parse_args(argv)
    failures.use_termination_log(args.termination_log)
    if settings.current().rank == 0:  # once per job (the launcher says it once per pod)
        settings.warn_ignored_control(log, "train")
    try:
        cfg = load_config(args.config)
    except BadInputError as e:
        if args.debug:
            traceback.print_exc()
        print(f"kubetune trainer: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        outcome = run(cfg, progress_bar=args.progress_bar, debug=args.debug)
    except Exception as e:  # classified, reported, and the exit code says whether to retry
        if args.debug:
            traceback.print_exc()
        failure = failures.classify(e)
        if failure.reason == Failure.UNKNOWN:
            log.error("unexpected error", exc_info=e)
        failures.report(failure)
        return failure.exit_code
    if outcome.failure is not None:
        failures.report(outcome.failure, logged=outcome.status == "refused")
    elif outcome.status == "preempted":
        step = outcome.result.get("latest_checkpoint_step")
        failures.report(
            TrainingFailure.of(Failure.PREEMPTED, f"SIGTERM; the newest checkpoint is step {step}", step)
        )
    if outcome.status in ("preempted", "failed"):
        # no collective goodbye: another rank may already be gone
        sys.stderr.flush()
    else:
        close_process_group()
    return outcome.exit_code


def close_process_group() -> None:
    """Leave the process group (NCCL/gloo) cleanly when torchrun started one."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:  # never imported, so never joined (a refusal before training): torch not loaded for it
        return
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
