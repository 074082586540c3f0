"""``kubetune watch <name>``: follow a FineTuneJob until it ends.

Shows the phase (and why, from the status conditions), the preparation report once it is there
(examples, tokens, lengths, and the estimate of memory, time and GPU-hours), a progress bar with the step, loss, tokens per
second and ETA the trainer reports, each retry after CUDA out of memory (the micro-step layout before
and after), then the registered model, or why training failed (the reason, what happened, what it
means and what to do), whether it stopped at spec.budget, how often Kueue preempted it, and where
the GPU time went (goodput). The
MLflow UI links (the run as soon as the trainer reports it, the registered version at the end) are
printed when the tracking server is an http(s) URL; so is the evaluation gate's verdict. On a
terminal the progress line is redrawn in place; otherwise (CI logs, pipes) a line is printed whenever
something changes.

    kubetune watch qwen3-4b-assistant
    kubetune watch qwen3-4b-assistant -n team-llm --timeout 6h
    kubetune watch my-job --kubeconfig ~/.kube/prod --context gpu-cluster

Exit status: 0 when the job Succeeded, 1 when it Failed, 2 when it does not exist or was deleted,
3 when --timeout passed first. A Suspended job is followed until it resumes and ends.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, cast

from kubetune_api import spec as api
from kubetune_api.failures import HINTS, MEANINGS, Failure
from kubetune_api.preparation import PreparationReport
from kubetune_api.status import ConditionType, Phase

from .report import render_report

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_MISSING = 2
EXIT_TIMEOUT = 3

FINAL = {Phase.SUCCEEDED: EXIT_SUCCEEDED, Phase.FAILED: EXIT_FAILED}
BAR_WIDTH = 24
# Which condition explains each phase best.
PHASE_CONDITION: dict[Phase, tuple[ConditionType, ...]] = {
    Phase.PENDING: (ConditionType.CHILDREN_READY, ConditionType.TRAINING, ConditionType.READY),
    Phase.PREPARING: (ConditionType.PREPARED,),
    Phase.TRAINING: (ConditionType.TRAINING,),
    Phase.SUSPENDED: (ConditionType.SUSPENDED,),
    Phase.REGISTERING: (ConditionType.REGISTERED,),
    Phase.SUCCEEDED: (ConditionType.READY,),
    Phase.FAILED: (ConditionType.READY,),
}


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "watch",
        help="follow a FineTuneJob: phase, progress, loss, ETA, then the registered model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", help="FineTuneJob name")
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, else default)")
    p.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)"
    )
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument(
        "--timeout", type=parse_duration, default=None, help="give up after this long, e.g. 90m, 6h"
    )
    p.set_defaults(func=_run)


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``6h``, ``1h30m`` → seconds."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?", text.strip())
    if not text.strip() or parts is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 15m, 6h, 1h30m)")
    h, m, s = (int(g) if g else 0 for g in parts.groups())
    return float(h * 3600 + m * 60 + s)


# --- formatting (pure) -----------------------------------------------------------------------------


def format_duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "?"
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def progress_bar(percent: float | None, width: int = BAR_WIDTH) -> str:
    p = 0.0 if percent is None else max(0.0, min(100.0, float(percent)))
    filled = round(width * p / 100)
    return "[" + "#" * filled + "-" * (width - filled) + f"] {int(p):3d}%"


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in status.get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


def phase_reason(status: dict[str, Any]) -> str:
    """The message of the condition that best explains the current phase."""
    phase = status.get("phase") or Phase.PENDING
    for ctype in PHASE_CONDITION.get(phase, (ConditionType.READY,)):
        c = condition(status, ctype)
        if c and (c.get("message") or c.get("reason")):
            if phase == Phase.PENDING and ctype == ConditionType.CHILDREN_READY and c.get("status") == "True":
                continue  # "children exist" says nothing about why it is pending
            return str(c.get("message") or c.get("reason"))
    return ""


def progress_line(status: dict[str, Any]) -> str:
    """``[#####-----]  50%  step 25/50  epoch 0.50  loss 1.5000  eval 1.6000  12,345 tok/s  ETA 10m00s``"""
    p = status.get("progress") or {}
    percent = p.get("percent")
    if percent is None and p.get("step") is not None and p.get("totalSteps"):
        percent = 100.0 * p["step"] / p["totalSteps"]
    parts = [progress_bar(percent)]
    if p.get("step") is not None:
        parts.append(f"step {p['step']}" + (f"/{p['totalSteps']}" if p.get("totalSteps") else ""))
    if p.get("epoch") is not None:
        parts.append(f"epoch {p['epoch']:.2f}")
    if p.get("loss") is not None:
        parts.append(f"loss {p['loss']:.4f}")
    if p.get("evalLoss") is not None:
        parts.append(f"eval {p['evalLoss']:.4f}")
    if p.get("tokensPerSecond") is not None:
        parts.append(f"{p['tokensPerSecond']:,.0f} tok/s")
    if p.get("etaSeconds") is not None:
        parts.append(f"ETA {format_duration(p['etaSeconds'])}")
    return "  ".join(parts)


def training_failure(status: dict[str, Any]) -> tuple[Failure, str] | None:
    """The failure reason and message the operator put on the Ready (else the Training) condition,
    when its reason is one of :class:`~kubetune_api.failures.Failure`."""
    for ctype in (ConditionType.READY, ConditionType.TRAINING):
        c = condition(status, ctype)
        if c and c.get("status") == "False" and c.get("reason") in set(Failure):
            return Failure(c["reason"]), str(c.get("message") or "")
    return None


def failure_lines(reason: Failure, message: str) -> list[str]:
    """``DiskFull at step 120: ...``, then what it means, what to do, and what the operator added.

    The operator's message is ``TrainingFailure.describe()`` (which holds the hint) and where to look
    next (the logs command, the checkpoint claim): the hint is shown once, on its own line.

    >>> failure_lines(Failure.DISK_FULL, "No space left on device")[:2]
    ['DiskFull: No space left on device', '  what it means: the checkpoint volume is full (No space left on device)']
    """
    hint = HINTS[reason]
    head, found, rest = message.strip().partition(hint)
    head = head.rstrip()
    if found:
        head = head.removesuffix("What to do:").rstrip().removesuffix(".")
    if not head:
        head = str(reason)
    elif not (head == reason or head.startswith((f"{reason} ", f"{reason}:"))):
        head = f"{reason}: {head}"
    lines = [head, f"  what it means: {MEANINGS[reason]}", f"  what to do: {hint}"]
    rest = rest.strip().removeprefix(".").strip()
    return [*lines, f"  {rest}"] if rest else lines


def budget_line(status: dict[str, Any]) -> str | None:
    """Why a succeeded job stopped early: the BudgetReached condition's message (else the trainer's
    status.budget, in the same words); None when it did not stop at spec.budget."""
    c = condition(status, ConditionType.BUDGET_REACHED)
    if c and c.get("status") == "True":
        return str(c.get("message") or "training stopped at spec.budget")
    budget = status.get("budget") or {}
    if budget.get("reached"):
        line = "training stopped at spec.budget" + (f" {budget['limit']}" if budget.get("limit") else "")
        if budget.get("step") is not None:
            line += f": step {budget['step']}" + (
                f" of {budget['totalSteps']} planned" if budget.get("totalSteps") else ""
            )
        return line
    return None


def goodput_line(status: dict[str, Any]) -> str | None:
    """Where the GPU time went (status.goodput, in GPU-seconds), one line; None before it is reported.

    >>> goodput_line({"goodput": {"heldGpuSeconds": 5040, "productiveGpuSeconds": 4410,
    ...     "restartLostGpuSeconds": 300, "startupGpuSeconds": 230, "checkpointGpuSeconds": 100,
    ...     "restarts": 1, "goodputPercent": 87.5}})
    'Goodput 87.5%: of 5,040 GPU-seconds held, 4,410 productive, 300 lost to 1 restart, 230 start-up, 100 saving checkpoints'

    Preempted attempts (SIGTERM: Kueue, the scheduler, a drain) are told apart, with the wait they cost:

    >>> goodput_line({"goodput": {"heldGpuSeconds": 5040, "productiveGpuSeconds": 4410,
    ...     "preemptionLostGpuSeconds": 300, "startupGpuSeconds": 230, "checkpointGpuSeconds": 100,
    ...     "restarts": 1, "preemptions": 1, "preemptedSeconds": 900, "goodputPercent": 87.5}})
    'Goodput 87.5%: of 5,040 GPU-seconds held, 4,410 productive, 0 lost to 1 restart, 230 start-up, 100 saving checkpoints; 1 preemption: 300 lost, 900 s waiting to run again'
    """
    g = status.get("goodput")
    if not isinstance(g, dict):
        return None

    def seconds(key: str) -> float:
        value = g.get(key)
        return float(value) if isinstance(value, int | float) else 0.0

    held = seconds("heldGpuSeconds")
    percent = g.get("goodputPercent")
    if not isinstance(percent, int | float):
        percent = 100 * seconds("productiveGpuSeconds") / held if held > 0 else None
    restarts = g.get("restarts") if isinstance(g.get("restarts"), int) else 0
    line = (
        f"Goodput {'?' if percent is None else f'{percent:.1f}%'}: of {held:,.0f} GPU-seconds held, "
        f"{seconds('productiveGpuSeconds'):,.0f} productive, "
        f"{seconds('restartLostGpuSeconds'):,.0f} lost to {restarts} restart{'' if restarts == 1 else 's'}, "
        f"{seconds('startupGpuSeconds'):,.0f} start-up, {seconds('checkpointGpuSeconds'):,.0f} saving checkpoints"
    )
    preemptions = g.get("preemptions") if isinstance(g.get("preemptions"), int) else 0
    if preemptions:
        line += (
            f"; {preemptions} preemption{'' if preemptions == 1 else 's'}: "
            f"{seconds('preemptionLostGpuSeconds'):,.0f} lost, {seconds('preemptedSeconds'):,.0f} s waiting to run again"
        )
    return line


def preemption_line(status: dict[str, Any]) -> str | None:
    """How often Kueue took the training back (status.preemptions), one line; None when it never did.

    >>> preemption_line({"preemptions": {"count": 2, "lastReason": "Preempted",
    ...     "lastPreemptionReason": "InClusterQueue", "preemptedSeconds": 900}})
    'Preempted by Kueue 2 times (last: InClusterQueue), 15m00s waiting to be admitted again'
    """
    p = status.get("preemptions")
    if not isinstance(p, dict) or not isinstance(p.get("count"), int) or p["count"] < 1:
        return None
    count, why = p["count"], p.get("lastPreemptionReason") or p.get("lastReason")
    waited = p.get("preemptedSeconds")
    line = f"Preempted by Kueue {count} time{'' if count == 1 else 's'}" + (f" (last: {why})" if why else "")
    if isinstance(waited, int | float):
        line += f", {format_duration(waited)} waiting to be admitted again"
    return line


def memory_retry_line(retry: dict[str, Any]) -> str:
    """``CUDA out of memory at step 40: retry 1, <layout before> -> <layout after>`` (status.memoryRetries)."""
    at = f" at step {retry['step']}" if retry.get("step") is not None else ""
    return (
        f"CUDA out of memory{at}: retry {retry.get('attempt', '?')}, "
        f"{retry.get('before', '?')} -> {retry.get('after', '?')}"
    )


def _loss(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, int | float) and not isinstance(value, bool) else "unknown"


def evaluation_line(status: dict[str, Any]) -> str | None:
    """What was registered (or refused) and the gate's verdict (status.evaluation); None without one.

    >>> evaluation_line({"evaluation": {"selected": "checkpoint-40", "evalLoss": 1.2, "threshold": 1.5,
    ...     "baseEvalLoss": 1.6, "gatePassed": True}})
    'Evaluation: checkpoint-40, eval loss 1.2000; gate met (threshold 1.5000, base model 1.6000)'
    """
    e = status.get("evaluation")
    if not isinstance(e, dict) or not e:
        return None
    line = f"Evaluation: {e.get('selected') or 'final'}, eval loss {_loss(e.get('evalLoss'))}"
    if e.get("gatePassed") is None:
        return line
    verdict = "gate met" if e["gatePassed"] else "gate NOT met"
    if e.get("forced"):
        verdict += ", registered on request (forced)"
    base = f", base model {_loss(e['baseEvalLoss'])}" if e.get("baseEvalLoss") is not None else ""
    return f"{line}; {verdict} (threshold {_loss(e.get('threshold'))}{base})"


def succeeded_lines(status: dict[str, Any]) -> list[str]:
    """A succeeded job: the budget stop, the registered model (or why none) with its UI link, the
    evaluation, and the MLflow run with its UI link."""
    lines: list[str] = []
    budget = budget_line(status)
    if budget:
        lines.append(budget)
    model = status.get("registeredModel") or {}
    if model.get("name"):
        line = f"Registered model {model['name']} version {model.get('version', '?')}"
        if model.get("uri"):
            line += f"  ({model['uri']})"
        if model.get("alias"):
            line += f"  alias @{model['alias']}"
    else:
        line = phase_reason(status) or str(Phase.SUCCEEDED)
    lines.append(line)
    if model.get("url"):
        lines.append(f"  {model['url']}")
    evaluation = evaluation_line(status)
    if evaluation:
        lines.append(evaluation)
    # the training's run (the trainer reports it); without one, the run the version was logged from
    mlflow = status.get("mlflow") or {k: model[k] for k in ("runId", "runUrl") if model.get(k)}
    if mlflow.get("runId"):
        lines.append(
            f"MLflow run {mlflow['runId']}"
            + (f" on {mlflow['trackingUri']}" if mlflow.get("trackingUri") else "")
        )
    if mlflow.get("runUrl"):
        lines.append(f"  {mlflow['runUrl']}")
    return lines


def outcome(status: dict[str, Any]) -> str:
    """The closing lines: the registered model (with its run) or why it failed; then whether it stopped
    at the budget and the goodput."""
    lines: list[str] = []
    if status.get("phase") == Phase.SUCCEEDED:
        lines = succeeded_lines(status)
    else:
        failure = training_failure(status)
        if failure is not None:
            lines.extend(failure_lines(*failure))
        else:
            lines.append(phase_reason(status) or "the FineTuneJob failed")
    preempted = preemption_line(status)
    if preempted:
        lines.append(preempted)
    goodput = goodput_line(status)
    if goodput:
        lines.append(goodput)
    return "\n".join(lines)


def preparation_lines(status: dict[str, Any]) -> list[str]:
    """The preparation report (status.preparation) as lines; none before it is there (or unreadable)."""
    from pydantic import ValidationError

    body = status.get("preparation")
    if not isinstance(body, dict):
        return []
    try:
        return render_report(PreparationReport.model_validate(body))
    except ValidationError:
        return []


# --- following a stream of objects -----------------------------------------------------------------------


@dataclass
class Follower:
    """Turns successive versions of one FineTuneJob into output; knows when it is over."""

    out: TextIO
    tty: bool = False
    started: float = field(default_factory=time.monotonic)
    _phase: str | None = None
    _reason: str = ""
    _line: str = ""
    _drawn: bool = False
    _prepared: bool = False
    _retries: int = 0
    _run_url: str | None = None

    def show(self, obj: dict[str, Any]) -> int | None:
        """Render one version; the exit status once the job has ended, else None."""
        status = obj.get("status") or {}
        phase = status.get("phase") or Phase.PENDING
        reason = phase_reason(status)
        if phase != self._phase or reason != self._reason:
            self._end_line()
            stamp = format_duration(time.monotonic() - self.started)
            self._write(
                f"{stamp:>7}  {phase}" + (f": {reason}" if reason and phase not in FINAL else "") + "\n"
            )
            self._phase, self._reason = phase, reason
        if not self._prepared:
            lines = preparation_lines(status)
            if lines:
                self._end_line()
                self._write("".join(f"         {line}\n" for line in lines))
                self._prepared = True
        run_url = (status.get("mlflow") or {}).get("runUrl")
        if run_url and run_url != self._run_url and phase not in FINAL:
            self._end_line()
            self._write(f"         MLflow run: {run_url}\n")
            self._run_url = run_url
            self._line = ""
        retries = [r for r in status.get("memoryRetries") or [] if isinstance(r, dict)]
        if len(retries) > self._retries:
            self._end_line()
            self._write("".join(f"         {memory_retry_line(r)}\n" for r in retries[self._retries :]))
            self._retries = len(retries)
            self._line = ""  # the progress line, if any, is drawn again below the retry
        if phase in FINAL:
            self._end_line()
            self._write(outcome(status) + "\n")
            return FINAL[phase]
        if phase == Phase.TRAINING and status.get("progress"):
            line = progress_line(status)
            if line != self._line:
                if self.tty:
                    self._write("\r\033[2K" + line)
                    self._drawn = True
                else:
                    self._write(f"         {line}\n")
                self._line = line
        return None

    def gone(self) -> int:
        self._end_line()
        self._write("the FineTuneJob was deleted\n")
        return EXIT_MISSING

    def _end_line(self) -> None:
        if self._drawn:
            self._write("\n")
            self._drawn = False

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


def follow(versions: Iterable[dict[str, Any] | None], out: TextIO, *, tty: bool = False) -> int:
    """Follow successive versions (None: the object was deleted) to the end."""
    follower = Follower(out, tty=tty)
    for obj in versions:
        if obj is None:
            return follower.gone()
        result = follower.show(obj)
        if result is not None:
            return result
    follower._end_line()
    return EXIT_TIMEOUT


# --- the cluster -------------------------------------------------------------------------------------------


class NoClusterError(Exception):
    """No kubeconfig to load, or not the context asked for."""


def _load(kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
    """An ApiClient and the default namespace of the chosen context."""
    import os

    from kubernetes import client, config

    cfg = client.Configuration()
    namespace = "default"
    if (
        kubeconfig is None
        and context is None
        and os.environ.get("KUBERNETES_SERVICE_HOST")
        and not os.environ.get("KUBECONFIG")
    ):
        config.load_incluster_config(client_configuration=cfg)
        ns_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        if ns_file.exists():
            namespace = ns_file.read_text().strip() or namespace
    else:
        try:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        except config.ConfigException as e:  # no kubeconfig, none of its contexts, no such context
            raise NoClusterError(str(e)) from e
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        if context:
            contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
            active = next((c for c in contexts if c["name"] == context), active)
        namespace = (active or {}).get("context", {}).get("namespace") or namespace
    return client.ApiClient(cfg), namespace


def versions(
    api_client: Any, namespace: str, name: str, deadline: float | None
) -> Iterator[dict[str, Any] | None]:
    """The FineTuneJob now, then every change (a watch, re-listed when it expires); None when deleted."""
    from kubernetes import client, watch
    from kubernetes.client.exceptions import ApiException

    objects = client.CustomObjectsApi(api_client)
    selector = f"metadata.name={name}"
    while deadline is None or time.monotonic() < deadline:
        listed = cast(
            dict[str, Any],
            objects.list_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, field_selector=selector
            ),
        )
        items = listed.get("items") or []
        if not items:
            yield None
            return
        yield items[0]
        resource_version = listed["metadata"]["resourceVersion"]
        remaining = 60 if deadline is None else max(1, min(60, int(deadline - time.monotonic())))
        try:
            for event in watch.Watch().stream(
                objects.list_namespaced_custom_object,
                api.GROUP,
                api.VERSION,
                namespace,
                api.PLURAL,
                field_selector=selector,
                resource_version=resource_version,
                timeout_seconds=remaining,
            ):
                if event["type"] == "DELETED":
                    yield None
                    return
                if event["type"] in ("ADDED", "MODIFIED"):
                    yield event["object"]
                if deadline is not None and time.monotonic() >= deadline:
                    return
        except ApiException as e:
            if e.status != 410:  # 410 Gone: the resourceVersion is too old; list again
                raise


def _run(args: argparse.Namespace) -> int:
    try:
        api_client, default_namespace = _load(args.kubeconfig, args.context)
    except ModuleNotFoundError:
        sys.stderr.write("kubetune watch needs the Kubernetes client: pip install 'kubetune[operator]'\n")
        return EXIT_MISSING
    except NoClusterError as e:
        sys.stderr.write(
            f"kubetune watch: no cluster to follow the job in: {e} (--kubeconfig, --context or KUBECONFIG)\n"
        )
        return EXIT_MISSING
    namespace = args.namespace or default_namespace
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    with api_client:
        stream = versions(api_client, namespace, args.name, deadline)
        first = next(stream, None)
        if first is None:
            sys.stderr.write(f"FineTuneJob {namespace}/{args.name} not found\n")
            return EXIT_MISSING
        sys.stdout.write(
            f"Following FineTuneJob {namespace}/{args.name} (Ctrl-C stops watching, not the job)\n"
        )

        def chained() -> Iterator[dict[str, Any] | None]:
            yield first
            yield from stream

        try:
            code = follow(chained(), sys.stdout, tty=sys.stdout.isatty())
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            return 130
    if code == EXIT_TIMEOUT:
        sys.stderr.write(f"timed out after {format_duration(args.timeout)}; the job goes on\n")
    return code
