"""Talking to an MLflow tracking server that may be down: retries with backoff, and no leaked secrets.

:class:`Retrier` runs one MLflow call at a time and sorts failures into three kinds:

* *unreachable* (connection refused or reset, timeouts, HTTP 5xx, 408, 429): wait with exponential
  backoff and try again, until MLflow has been unreachable for ``budget_s`` seconds in total over
  the whole process; then :class:`MlflowUnavailableError`.
* *refused* (any other HTTP 4xx: permission denied, invalid name, ...): :class:`MlflowRefusedError`
  at once; trying again would get the same answer.
* anything else (a bug, a bad model folder): raised unchanged.

MLflow's own HTTP client retries too (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, default 7 with
exponential backoff, minutes per request). :func:`configure_mlflow_http` turns that off unless the
environment already sets it, so that one documented budget bounds the wait.

Credentials reach the process only as environment variables (``MLFLOW_TRACKING_TOKEN``,
``MLFLOW_TRACKING_USERNAME``, ``MLFLOW_TRACKING_PASSWORD``, ``HF_TOKEN``);
:func:`kubetune_trainer.mlflow.run.redact` removes their values (and ``user:password@`` in URIs)
from any text, and :func:`install_log_redaction` applies it to every log handler and
:func:`redacted_stdio` to what is printed.

>>> classify_http_status(503), classify_http_status(403), classify_http_status(None)
('unreachable', 'refused', None)
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from .run import redact

log = logging.getLogger(__name__)

T = TypeVar("T")

# Retried: the server is down, restarting, overloaded, or a proxy in front of it says so.
UNREACHABLE_HTTP_STATUS = frozenset({408, 429, 500, 502, 503, 504})

Failure = Literal["unreachable", "refused"]


class MlflowError(RuntimeError):
    """MLflow could not do what registration needs."""


class MlflowRefusedError(MlflowError):
    """MLflow answered with a 4xx: the request is wrong or not allowed; retrying will not help."""

    def __init__(self, message: str, status: int | None = None, error_code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code


class MlflowUnavailableError(MlflowError):
    """MLflow stayed unreachable for the whole retry budget."""


# --- credentials out of logs and prints (kubetune_trainer.mlflow.run.redact) ---------------------


class RedactingFilter(logging.Filter):
    """Rewrites every record's message with :func:`redact` (libraries log URLs and headers too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a library's malformed log call must not break logging
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            # Tracebacks are formatted from the exception; keep the text, drop the live object.
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def install_log_redaction() -> None:
    """Add :class:`RedactingFilter` to every handler known now (call again after heavy imports).

    MLflow and transformers attach their own handlers to their own loggers (not to the root), so
    each one gets the filter.
    """
    loggers: list[logging.Logger] = [logging.getLogger()]
    loggers += [lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(f, RedactingFilter) for f in handler.filters):
                handler.addFilter(RedactingFilter())


class RedactingStream:
    """A text stream that redacts what is written to it: MLflow prints run URLs with ``print``."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def redacted_stdio() -> Iterator[None]:
    """Redact ``sys.stdout`` and ``sys.stderr`` for the duration (handlers made meanwhile keep it)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


# --- MLflow's own HTTP retries --------------------------------------------------------------------------


def configure_mlflow_http() -> None:
    """Leave retrying to :class:`Retrier` (unless the environment chose otherwise).

    Must run before the first MLflow request: MLflow reads the variable per request, and caches its
    HTTP session per retry setting. ``MLFLOW_HTTP_REQUEST_TIMEOUT`` (MLflow's default, 120 s) stays:
    an upload of model weights needs it, and it bounds how far one attempt may overrun the budget.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")


# --- classifying failures -------------------------------------------------------------------------------


def classify_http_status(status: int | None) -> Failure | None:
    if status is None:
        return None
    if status in UNREACHABLE_HTTP_STATUS or status >= 500:
        return "unreachable"
    if 400 <= status < 500:
        return "refused"
    return None


def _response_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _host(url: str) -> str:
    """The host (and port) a URL names, without user information."""
    return urlsplit(url).netloc.rsplit("@", 1)[-1].lower()


def _request_host(exc: BaseException) -> str | None:
    request = getattr(exc, "request", None)
    url = getattr(request, "url", None)
    return _host(str(url)) if url else None


Classified = tuple[Failure | None, int | None, str | None]


def classify(exc: BaseException, tracking_uri: str | None = None) -> Classified:
    """(kind, HTTP status, MLflow error code) of a failed MLflow call.

    With ``tracking_uri``, an HTTP failure of a request to another host (the Hugging Face Hub, which
    MLflow asks for a base model's commit) is not an MLflow outage: kind None.
    """
    import requests
    from mlflow.exceptions import MlflowException, RestException

    host = _request_host(exc)
    tracking_host = _host(tracking_uri) if tracking_uri else ""
    if host and tracking_host and host != tracking_host:
        return None, None, None
    if isinstance(exc, requests.ConnectionError | requests.Timeout | ConnectionError | TimeoutError):
        return "unreachable", None, None
    if isinstance(exc, RestException):
        # The server answered with an MLflow error body: its error code says what happened.
        status = exc.get_http_status_code()
        return classify_http_status(status), status, exc.error_code
    if isinstance(exc, MlflowException):
        return _classify_mlflow_exception(exc)
    status = _response_status(exc)  # requests.HTTPError from the artifact proxy
    return classify_http_status(status), status, None


def _classify_mlflow_exception(exc: Any) -> Classified:
    """A plain ``MlflowException``: MLflow wraps transport failures ("failed with exception ...",
    after its own retries ran out on a 5xx) and non-JSON error pages ("failed with error code 502")
    in one; other plain MlflowExceptions are local mistakes, not outages."""
    message = str(exc)
    if not message.startswith("API request to"):
        return None, None, exc.error_code
    if "failed with exception" in message:
        return "unreachable", None, exc.error_code
    status = exc.get_http_status_code()
    return classify_http_status(status), status, exc.error_code


# --- retrying -------------------------------------------------------------------------------------------


@dataclass
class Retrier:
    """Runs MLflow calls, retrying while the server is unreachable, within one total budget.

    ``budget_s`` bounds the total time spent on failed attempts and waits over the life of the
    object (so over the whole registration), not per call: once MLflow has been unreachable that
    long in total, the next failure raises :class:`MlflowUnavailableError`. Waits double from
    ``initial_delay_s`` up to ``max_delay_s``, with jitter, and never sleep past the budget.
    """

    tracking_uri: str
    budget_s: float
    initial_delay_s: float = 1.0
    max_delay_s: float = 30.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    outage_s: float = field(default=0.0, init=False)

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        uri = redact(self.tracking_uri)
        delay = self.initial_delay_s
        attempt = 0
        while True:
            attempt += 1
            started = self.clock()
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                kind, status, code = classify(exc, self.tracking_uri)
                detail = redact(f"{type(exc).__name__}: {exc}").strip()
                if kind == "refused":
                    raise MlflowRefusedError(
                        f"MLflow at {uri} refused to {what}"
                        f"{f' (HTTP {status}' + (f', {code})' if code else ')') if status else ''}: {detail}",
                        status=status,
                        error_code=code,
                    ) from exc
                if kind is None:
                    raise
                self.outage_s += self.clock() - started
                left = self.budget_s - self.outage_s
                if left <= 0:
                    raise MlflowUnavailableError(
                        f"MLflow at {uri} is unreachable: could not {what} after {attempt} attempts "
                        f"over {self.outage_s:.0f}s (retry budget {self.budget_s:g}s); last error: {detail}"
                    ) from exc
                wait = min(delay * random.uniform(0.8, 1.2), self.max_delay_s, left)
                log.warning(
                    "MLflow at %s unreachable (%s; attempt %d, %.0fs of %gs retry budget used); "
                    "retrying in %.1fs",
                    uri,
                    detail[:300],
                    attempt,
                    self.outage_s,
                    self.budget_s,
                    wait,
                )
                self.sleep(wait)
                self.outage_s += wait
                delay = min(delay * 2, self.max_delay_s)
