"""``kubetune run job.yaml --local``: fine-tune a FineTuneJob on this machine, then register it.

The same FineTuneJob that the operator runs in a cluster runs here, in one process, on the CPU (or
the GPU if there is one), with a progress bar::

    kubetune run examples/tiny-local.yaml --local
    kubetune run job.yaml --local --output-dir /data/runs/job --tracking-uri http://127.0.0.1:5000

What happens:

1. The manifest is resolved into the trainer config the operator would render
   (:func:`kubetune_api.trainer_config.resolve`), written to ``<output-dir>/config.yaml``.
2. Paths under ``/opt/kubetune/tiny/`` (the tiny model and data set that the trainer image carries)
   are mapped to a local cache folder (``--cache-dir``, default ``~/.cache/kubetune/tiny``) and
   built there when missing: a random-init Qwen2-architecture model with a tokenizer trained on
   kubetune's own chat data, so nothing is downloaded. Other paths are used as they are; they
   must be absolute, as the API server requires (the same manifest runs in a cluster).
3. The preparation step runs first (:mod:`kubetune_cli.prepare`): the data is checked and
   tokenized once into ``<output-dir>/prepared``, and the report (examples, tokens, lengths,
   and for a job that asks for GPUs the memory, time and GPU-hours estimate) is shown; a refusal
   (empty data, no assistant turns, mostly truncated, ...) ends the run with exit code 2.
4. Training writes checkpoints (``<output-dir>/checkpoints``, default output dir ``./runs/<name>``);
   run the same command again after an interruption and it resumes from the newest complete one.
5. MLflow: ``--tracking-uri``, the manifest's ``registration.trackingUri``, ``MLFLOW_TRACKING_URI``,
   or a local sqlite store in the output folder, in that order. The trained model is registered
   there (``kubetune_trainer.register``). A tracking URI with credentials (``user:password@``),
   wherever it comes from, is refused: they go in ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``.
6. It prints where everything is, and how to look at it (``mlflow ui ...``).

Chained jobs: ``spec.model.fromJob: {name: a}`` trains from job ``a``'s run folder beside this
one's (``runs/a`` for the default ``runs/<name>``; with ``--output-dir X/b``, ``X/a``): its
``final/`` (complete, with its COMPLETE marker), or for ``checkpoint: bestEval`` the checkpoint or
final model with the lowest eval loss; a LoRA adapter is merged into ``a``'s base first. A missing
folder, an unfinished ``final/`` or no eval loss for bestEval ends the run (exit 2) naming the
field and the folder looked at. ``spec.model.registered: models:/<name>@<alias>`` (or
``/<version>``) is looked up in this run's tracking URI (as above: a registry shared with the run
that registered it needs ``--tracking-uri`` or ``MLFLOW_TRACKING_URI``, since each run folder's
default store is its own), resolved to a version once and downloaded into ``prepared/model``.

Bad input (a manifest that is not a FineTuneJob, a field misspelt, data that cannot train: an
empty file, a malformed line, a row without the format's column, an unknown chat role) ends the run
before anything is built or written, with one message naming the file, the line and the field, and
exit code 2 (``--debug`` adds the traceback). See :mod:`kubetune_trainer.sources.data_check`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from kubetune_api.registration import EXIT_GATE_NOT_MET
from kubetune_api.spec import FineTuneJob, registration_error
from kubetune_api.trainer_config import (
    CHECKPOINTS_DIR,
    COMPLETE_MARKER,
    EXIT_PREEMPTED,
    FINAL_DIR,
    MLFLOW_RUN_FILE,
    REGISTER_RESULT_FILE,
    START_FILE,
    TRAIN_RESULT_FILE,
    ParentModel,
    TrainerConfig,
    load_manifest,
    resolve,
)
from kubetune_trainer.mlflow.run import local_store_uri, redact
from kubetune_trainer.sources.data_check import EXIT_BAD_INPUT, BadInputError, validation_lines
from kubetune_trainer.tiny import TINY_ROOT  # where the trainer image carries the tiny assets

CONFIG_FILE = "config.yaml"


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="fine-tune a FineTuneJob on this machine (--local)",
        description=__doc__.split("\n")[0],
    )
    p.add_argument("manifest", type=Path, help="FineTuneJob YAML file")
    p.add_argument("--local", action="store_true", help="train on this machine (CPU, or a GPU if present)")
    p.add_argument("--output-dir", type=Path, default=None, help="run folder (default: ./runs/<name>)")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where the tiny model is built (default: $KUBETUNE_CACHE or ~/.cache/kubetune/tiny)",
    )
    p.add_argument(
        "--tracking-uri", default=None, help="MLflow tracking URI (default: sqlite in the run folder)"
    )
    p.add_argument(
        "--no-register", action="store_true", help="train only; skip the MLflow model registration"
    )
    p.add_argument(
        "--progress-bar", action=argparse.BooleanOptionalAction, default=True, help="show a progress bar"
    )
    p.add_argument(
        "--debug", action="store_true", help="show the traceback of a bad-input error (manifest, data)"
    )
    p.set_defaults(func=_run)


def default_cache_dir() -> Path:
    if os.environ.get("KUBETUNE_CACHE"):
        return Path(os.environ["KUBETUNE_CACHE"]) / "tiny"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kubetune" / "tiny"


def localize_path(path: str | None, *, manifest_dir: Path, cache_dir: Path) -> tuple[str | None, bool]:
    """The local path for a manifest path, and whether it is one of the tiny assets."""
    if path is None:
        return None, False
    if path == TINY_ROOT or path.startswith(TINY_ROOT + "/"):
        return str(cache_dir / path[len(TINY_ROOT) :].lstrip("/")), True
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else (manifest_dir / p).resolve()), False


def localize(job: FineTuneJob, *, manifest_dir: Path, cache_dir: Path) -> tuple[FineTuneJob, bool]:
    """The job with its model and data paths pointing at this machine; True if tiny assets are used."""
    model_path, tiny_model = localize_path(
        job.spec.model.path, manifest_dir=manifest_dir, cache_dir=cache_dir
    )
    data_path, tiny_data = localize_path(
        job.spec.dataset.path, manifest_dir=manifest_dir, cache_dir=cache_dir
    )
    # Volumes are a cluster thing: locally the path is the path.
    model = job.spec.model.model_copy(update={"path": model_path, "volume": None})
    dataset = job.spec.dataset.model_copy(update={"path": data_path, "volume": None})
    spec = job.spec.model_copy(update={"model": model, "dataset": dataset})
    return job.model_copy(update={"spec": spec}), tiny_model or tiny_data


TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
REGISTRY_URI_ENV = "MLFLOW_REGISTRY_URI"
CREDENTIALS_REMEDY = (
    "give the URI without them, and the user and password in the environment variables "
    "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or a token in MLFLOW_TRACKING_TOKEN)"
)


def tracking_uri_error(uri: str | None, source: str) -> str | None:
    """The manifest's credential check (:func:`kubetune_api.spec.registration_error`) for a tracking
    URI given another way; the message names ``source`` and never repeats the URI."""
    if not uri or registration_error(None, uri) is None:
        return None
    return f"{source} must not carry credentials (user:password@ or a token in the URI): {CREDENTIALS_REMEDY}"


def read_manifest(manifest: Path) -> FineTuneJob:
    """The FineTuneJob in ``manifest``; :class:`BadInputError` naming the file, line or field otherwise."""
    import yaml
    from pydantic import ValidationError

    try:
        return load_manifest(manifest)
    except OSError as e:
        raise BadInputError(f"{manifest}: cannot read it ({e.strerror or e})") from e
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise BadInputError(f"{manifest}{where}: not valid YAML ({e.problem or e.context})") from e
    except yaml.YAMLError as e:
        raise BadInputError(f"{manifest}: not valid YAML ({' '.join(str(e).split())})") from e
    except ValidationError as e:
        raise BadInputError("\n".join(f"{manifest}: {line}" for line in validation_lines(e))) from e
    except ValueError as e:  # a rule the API server would apply: one line per problem
        lines = getattr(e, "problems", None) or [str(e).removeprefix(f"{manifest}: ")]
        raise BadInputError("\n".join(f"{manifest}: {line}" for line in lines)) from e


def local_config(
    manifest: Path, *, output_dir: Path | None, cache_dir: Path | None, tracking_uri: str | None
) -> tuple[TrainerConfig, bool, Path]:
    """The trainer config of a local run (not yet written), whether it needs the tiny assets, and the cache.

    Every tracking URI offered (the flag, the manifest, ``MLFLOW_TRACKING_URI``) and the registry URI
    of ``MLFLOW_REGISTRY_URI`` (the manifest's ``registryUri`` wins over it) go through the same
    credential check, used or not: :class:`BadInputError` names the one that carries credentials.
    """
    job = read_manifest(manifest)
    from_env = os.environ.get(TRACKING_URI_ENV) or None
    registry_from_env = os.environ.get(REGISTRY_URI_ENV) or None
    for uri, source in (
        (tracking_uri, "--tracking-uri"),
        (from_env, f"the environment variable {TRACKING_URI_ENV}"),
        (registry_from_env, f"the environment variable {REGISTRY_URI_ENV}"),
    ):
        error = tracking_uri_error(uri, source)
        if error:
            raise BadInputError(error)
    cache = (cache_dir or default_cache_dir()).resolve()
    job, tiny = localize(job, manifest_dir=manifest.resolve().parent, cache_dir=cache)
    out = (output_dir or Path("runs") / job.metadata.name).resolve()
    default_uri = from_env or local_store_uri(out)
    cfg = resolve(
        job,
        default_tracking_uri=default_uri,
        default_registry_uri=registry_from_env,
        output_dir=str(out),
        report_progress=False,
    )
    if tracking_uri:
        cfg = cfg.model_copy(update={"tracking_uri": tracking_uri})
    ref = job.spec.model.from_job
    if ref is not None:
        runs = out.parent  # the parent's run folder sits beside this one's: runs/<parent name>
        parent = local_parent(runs / ref.name, ref.name, str(ref.checkpoint), runs=runs)
        cfg = cfg.model_copy(update={"parent": parent})
    return cfg, tiny, cache


FROM_JOB = "spec.model.fromJob"


def local_parent(folder: Path, name: str, checkpoint: str, *, runs: Path) -> ParentModel:
    """``spec.model.fromJob`` on this machine: the parent's run folder ``runs/<name>`` (beside this
    job's own), and in it the folder to start from (``final/``, or for ``bestEval`` the checkpoint
    or final model with the lowest eval loss), its method and, for a LoRA adapter, its base.
    :class:`BadInputError` naming the field and what was looked for when it is not there."""
    from kubetune_trainer.sources import chain
    from kubetune_trainer.volume import catalog

    looked = (
        f"{FROM_JOB}.name {name}: kubetune run --local looks for its run folder beside this job's, {folder}"
    )
    if not (folder / CONFIG_FILE).is_file():
        what = "there is no such folder" if not folder.is_dir() else f"it has no {CONFIG_FILE}"
        raise BadInputError(
            f"{looked}, and {what}. Run {name} first (kubetune run <its manifest> --local, with the same "
            f"--output-dir parent folder {runs})"
        )
    try:
        parent_cfg = TrainerConfig.load(folder / CONFIG_FILE)
    except (OSError, ValueError) as e:
        raise BadInputError(f"{looked}, and its {CONFIG_FILE} cannot be read: {e}") from e
    if not (folder / FINAL_DIR / COMPLETE_MARKER).is_file():
        raise BadInputError(
            f"{looked}, and {folder / FINAL_DIR} has no {COMPLETE_MARKER} marker: {name} has not finished "
            f"training. Run it to the end first (kubetune run <its manifest> --local resumes it)"
        )
    chosen = catalog.select_for_registration(folder, checkpoint)
    if checkpoint == "bestEval" and chosen.eval_loss is None:
        raise BadInputError(
            f"{FROM_JOB}.checkpoint is bestEval, but no checkpoint of {name} in {folder} has an eval loss "
            f"(it trained without eval data: spec.dataset.evalSplit or evalFraction). Use checkpoint: final"
        )
    run = _read_json(folder / MLFLOW_RUN_FILE)
    registered = _read_json(folder / REGISTER_RESULT_FILE)
    method = str(parent_cfg.spec.method)
    return ParentModel(
        job=name,
        uid=parent_cfg.job.uid,
        run_id=run.get("run_id"),
        model_uri=registered.get("uri"),
        path=str(chosen.path.resolve()),
        method=method,
        base_path=_parent_base(parent_cfg, folder) if method == "lora" else None,
        fingerprint=chain.fingerprint(chosen.path),
    )


def _parent_base(parent_cfg: TrainerConfig, folder: Path) -> str | None:
    """The base a LoRA parent's adapter goes on: its own starting model (a chained parent's, or the
    Hub model its preparation downloaded), else its spec's path or Hub id."""
    from kubetune_api.preparation import MODEL_DIR
    from kubetune_api.trainer_config import recorded_start

    start = recorded_start(folder)
    if start and start.get("folder"):
        where = Path(str(start["folder"]))
        return str(where if where.is_absolute() else folder / where)
    src = parent_cfg.spec.model
    if src.path:
        return src.path
    if (folder / MODEL_DIR / "config.json").is_file():
        return str(folder / MODEL_DIR)
    return src.name


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def register(config_path: Path) -> int:
    """Run the registration entry point in this process (the post-step Job's command in a cluster)."""
    from kubetune_trainer.registration import register as registration

    return int(registration.main(["--config", str(config_path), "--retry-budget", "60"]))


def summary(cfg: TrainerConfig, *, registered: bool) -> str:
    out = Path(cfg.output_dir)
    result = _read_json(out / TRAIN_RESULT_FILE)
    run = _read_json(out / MLFLOW_RUN_FILE)
    reg = _read_json(out / REGISTER_RESULT_FILE) if registered else {}
    uri = cfg.tracking_uri or ""
    lines = ["", f"kubetune: {cfg.job.name} trained locally", ""]
    # the whole run, across attempts: the first attempt's first loss, the steps of all of them
    first, final, steps = result.get("first_loss"), result.get("final_loss"), result.get("global_step")
    if first is not None and final is not None and steps is not None:
        resumed = result.get("resumed_from_step")
        note = f" (this attempt resumed at step {resumed})" if resumed else ""
        lines.append(f"  loss            {first:.3f} -> {final:.3f} in {steps} steps{note}")
    start = _read_json(out / START_FILE)
    if isinstance(start.get("parent"), dict):
        from kubetune_trainer.sources.chain import describe

        lines.append(f"  started from    {describe(ParentModel.model_validate(start['parent']))}")
    lines += [
        f"  run folder      {out}",
        f"  checkpoints     {out / CHECKPOINTS_DIR}",
        f"  final model     {out / FINAL_DIR}",
        f"  train result    {out / TRAIN_RESULT_FILE}",
        f"  trainer config  {out / CONFIG_FILE}",
        f"  MLflow          {uri}  (experiment {cfg.experiment!r}, run {run.get('run_id', '-')})",
    ]
    if result and not result.get("mlflow_ok", True):
        lines.append(
            f"                  MLflow was not reachable during training: {result.get('mlflow_error')}"
        )
    if reg:
        lines.append(
            f"  registered      {reg.get('uri')}  (name {reg.get('name')!r}, version {reg.get('version')})"
        )
        if cfg.registry_uri:
            lines.append(f"  model registry  {cfg.registry_uri}")
    lines.append("")
    if uri.startswith("sqlite:"):
        lines.append(
            f"  look at it:     mlflow ui --backend-store-uri {uri} --port 5000   # then http://127.0.0.1:5000"
        )
    elif uri:
        lines.append(f"  look at it:     open {uri} in a browser")
    if reg.get("uri"):
        registry = f" mlflow.set_registry_uri('{cfg.registry_uri}');" if cfg.registry_uri else ""
        lines.append(
            f"  load it:        python -c \"import mlflow; mlflow.set_tracking_uri('{uri}');{registry} "
            f"m = mlflow.transformers.load_model('{reg['uri']}'); print(m)\""
        )
    # the tracking URI and any credential from the environment never reach the terminal
    return redact("\n".join(lines) + "\n")


def _run(args: argparse.Namespace) -> int:
    if not args.local:
        print(
            "kubetune run: only --local runs here; to run in a cluster: kubectl apply -f "
            + str(args.manifest),
            file=sys.stderr,
        )
        return 2
    try:
        return _run_local(args)
    except BadInputError as e:
        if args.debug:
            traceback.print_exc()
        print(f"kubetune: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


def check_raw_data(cfg: TrainerConfig) -> Any:
    """The data check of the data as it is now (not what an earlier preparation recorded in the run
    folder): a data file changed under the same name must be seen before anything is prepared."""
    from kubetune_trainer.sources.data import check_raw_data as check

    return check(cfg)


def _prepare(cfg: TrainerConfig, other_training: Any, data_hash: str | None) -> int:
    """The preparation step, as in a cluster: the data tokenized once into the run folder (training
    reads it from there) and the report shown; a refusal ends the run before training (exit 2).

    Not over a folder that holds another training (the trainer refuses it as it is, untouched: the
    same check first, here), nor when its final model is complete (nothing left to train).
    """
    from kubetune_trainer.volume import checkpoints

    from .preparation import run_preparation

    out = Path(cfg.output_dir)
    attempt = checkpoints.decide_attempt(
        out, lambda path: other_training(path, cfg, data_hash), clean_up=False
    )
    if attempt.kind == checkpoints.AttemptKind.REFUSE:
        print(f"kubetune: {attempt.refusal}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if attempt.kind != checkpoints.AttemptKind.TRAIN:
        return 0
    print(f"kubetune: preparing {cfg.job.name} into {out}", file=sys.stderr)
    return run_preparation(cfg, sys.stderr, sys.stderr)


def _run_local(args: argparse.Namespace) -> int:
    from kubetune_trainer import settings
    from kubetune_trainer.process import skip_unused_libraries
    from kubetune_trainer.training import train

    # before anything imports transformers; torchao stays when KUBETUNE_FP8 asks for float8 training
    skip_unused_libraries(float8=settings.current().float8_asked)

    cfg, tiny, cache = local_config(
        args.manifest, output_dir=args.output_dir, cache_dir=args.cache_dir, tracking_uri=args.tracking_uri
    )
    data_path = cfg.spec.dataset.path
    tiny_data = data_path is not None and Path(data_path).is_relative_to(cache)
    # The data first: bad data ends the run before anything is built, written or loaded.
    checked = None if tiny_data else check_raw_data(cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / CONFIG_FILE
    config_path.write_text(cfg.to_yaml())

    if tiny:
        from kubetune_trainer.tiny import ensure_tiny_assets

        print(f"kubetune: tiny model and data in {cache} (built on first use, no download)", file=sys.stderr)
        ensure_tiny_assets(cache)
    checked = checked or check_raw_data(cfg)

    code = _prepare(cfg, train.other_training, checked.data_hash)
    if code != 0:
        return code
    print(f"kubetune: training {cfg.job.name} into {out}", file=sys.stderr)
    print("kubetune: Ctrl-C saves a checkpoint and stops (twice: stop now)", file=sys.stderr)
    outcome = train.run(
        cfg, progress_bar=args.progress_bar, ctrl_c_saves=True, checked=checked, debug=args.debug
    )
    if outcome.exit_code != 0:
        if outcome.status == "refused":
            print(f"kubetune: {outcome.result.get('error')}", file=sys.stderr)
        elif outcome.failure is not None:
            print(f"kubetune: training failed: {outcome.failure.describe()}", file=sys.stderr)
            if outcome.failure.retryable:
                print(
                    "kubetune: run the same command again to retry from the newest checkpoint",
                    file=sys.stderr,
                )
        if outcome.exit_code == EXIT_PREEMPTED:
            print(
                f"kubetune: stopped at a checkpoint in {out / CHECKPOINTS_DIR}; "
                "run the same command again to resume",
                file=sys.stderr,
            )
        return outcome.exit_code

    registered = False
    if cfg.spec.registration.enabled and not args.no_register:
        code = register(config_path)
        if code == EXIT_GATE_NOT_MET:
            print(
                "kubetune: training done, not registered: spec.registration.gate was not met (above); the "
                f"model stays in {out}. To register it anyway: python -m kubetune_trainer.register "
                f"--config {config_path} --force",
                file=sys.stderr,
            )
            sys.stdout.write(summary(cfg, registered=False))
            return code
        if code != 0:
            print(f"kubetune: training done, registration failed (exit {code})", file=sys.stderr)
            sys.stdout.write(summary(cfg, registered=False))
            return code
        registered = True
    sys.stdout.write(summary(cfg, registered=registered))
    return 0
