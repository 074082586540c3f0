"""MLflow's system metrics in the job's run, as ``mlflow.start_run(log_system_metrics=True)`` logs them.

While rank 0 trains, its machine's CPU use, memory, disk and network, and each NVIDIA GPU's
utilisation, memory and power go into the job's run under MLflow's names:
``system/cpu_utilization_percentage``, ``system/system_memory_usage_megabytes`` and ``_percentage``,
``system/disk_usage_megabytes``, ``system/network_receive_megabytes``,
``system/gpu_0_utilization_percentage``, ``system/gpu_0_memory_usage_megabytes``... (step 0, 1, 2...
per point; a restarted attempt goes on after the last step).

MLflow's :class:`~mlflow.system_metrics.system_metrics_monitor.SystemMetricsMonitor` takes the samples
(psutil for the host, NVML through nvidia-ml-py for the GPUs), averages them and logs them; kubetune
runs the sampling loop itself (:class:`SystemMetrics`), because MLflow's own loop

* asks the server for the run's status before every point and stops for good at the first failure,
  where a tracking server that blips must not end the metrics of a run that goes on: here a failed
  write drops that point, the samples meanwhile go into the next one, tried after :data:`RETRY_AFTER_S`;
* drops what it sampled since its last point when it is stopped, so a run shorter than the interval
  would have nothing: here stopping logs a last point.

A sample every :data:`SAMPLE_S` seconds, each one a point for the first :data:`DETAILED_S` seconds,
then the average of each :data:`LONG_SAMPLES` (a short run is seen in detail, a run of days does not
flood the server). MLflow's ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` and
``MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING``, where set (a local run's shell: a FineTuneJob's
``spec.env`` may not set ``MLFLOW_*``), fix them instead.

No GPU, no driver or no nvidia-ml-py: no GPU metrics, the rest as usual. Nothing here fails training:
starting, sampling and writing are guarded and logged once (and so is each of MLflow's warnings about
a GPU that cannot report a number, power on some GPUs or use on a MIG slice, which it repeats at
every sample). Only numbers under fixed names are
logged; MLflow's log lines go through the trainer's redaction (:func:`.client.install_log_redaction`).
:meth:`SystemMetrics.stop` (the tracker's ``finish``, before the run's attempt ends) stops the thread
and waits for it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from .client import install_log_redaction
from .run import redact

log = logging.getLogger(__name__)

SAMPLE_S = 5.0
DETAILED_S = 600.0
LONG_SAMPLES = 6
RETRY_AFTER_S = 60.0
# how long stop() waits for a write in flight (the tracker holds MLflow's HTTP retries to one, 10 s)
STOP_WAIT_S = 60.0
THREAD_NAME = "kubetune-system-metrics"
_ENV_SAMPLES = "MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING"
_GPU_LOGGER = "mlflow.system_metrics.metrics.gpu_monitor"


def samples_per_point(elapsed_s: float, fixed: int | None = None) -> int:
    """How many samples one point averages, ``elapsed_s`` into the run (``fixed``: MLflow's variable).

    >>> samples_per_point(30.0), samples_per_point(3600.0), samples_per_point(3600.0, fixed=2)
    (1, 6, 2)
    """
    if fixed is not None:
        return max(1, fixed)
    return 1 if elapsed_s < DETAILED_S else LONG_SAMPLES


class OncePerMessage(logging.Filter):
    """Lets each distinct message through once.

    >>> once, record = OncePerMessage(), logging.makeLogRecord({"msg": "no power reading"})
    >>> once.filter(record), once.filter(record)
    (True, False)
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


class SystemMetrics:
    """A thread that samples this machine and logs the samples into one MLflow run."""

    def __init__(self, run_id: str, tracking_uri: str, *, resume: bool) -> None:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        # MLflow's loggers exist now: their handlers get the redaction too
        install_log_redaction()
        gpu_log = logging.getLogger(_GPU_LOGGER)
        if not any(isinstance(f, OncePerMessage) for f in gpu_log.filters):
            gpu_log.addFilter(OncePerMessage())
        # resume: the steps go on after the last one a previous attempt logged
        self.monitor: Any = SystemMetricsMonitor(
            run_id, sampling_interval=SAMPLE_S, resume_logging=resume, tracking_uri=tracking_uri
        )
        self.interval = float(self.monitor.sampling_interval)
        self.fixed_samples = int(self.monitor.samples_before_logging) if _ENV_SAMPLES in os.environ else None
        self.gpus = any(type(m).__name__ in {"GPUMonitor", "ROCMMonitor"} for m in self.monitor.monitors)
        self.failed = False
        self._retry_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def start(cls, run_id: str, tracking_uri: str, *, resume: bool) -> SystemMetrics | None:
        """Sampling, from now on; None when MLflow's monitor cannot be made (logged, training goes on)."""
        try:
            metrics = cls(run_id, tracking_uri, resume=resume)
            # a sample thrown away: psutil's first CPU reading only sets what the next one measures from
            metrics.monitor.collect_metrics()
            metrics._drop_samples()
        except Exception as e:
            log.warning("MLflow system metrics are off for this run: %s", _why(e))
            return None
        metrics._thread = threading.Thread(target=metrics._loop, name=THREAD_NAME, daemon=True)
        metrics._thread.start()
        log.info(
            "MLflow system metrics every %gs (%s)",
            metrics.interval,
            "with GPUs" if metrics.gpus else "no GPU seen: CPU, memory, disk and network",
        )
        return metrics

    def _loop(self) -> None:
        started = time.monotonic()
        taken = 0
        while not self._stop.wait(self.interval):
            if not self._sample():
                continue
            taken += 1
            # while writes back off, the samples go into the next point
            due = taken >= samples_per_point(time.monotonic() - started, self.fixed_samples)
            if due and time.monotonic() >= self._retry_at:
                self._log_point()
                taken = 0

    def _sample(self) -> bool:
        try:
            self.monitor.collect_metrics()
            return True
        except Exception as e:  # psutil or NVML: a sample missed
            log.debug("system metrics: a sample failed: %s", _why(e))
            return False

    def _log_point(self) -> None:
        """Average the samples since the last point into one point and write it now."""
        try:
            self.monitor.publish_metrics(self.monitor.aggregate_metrics())
            self.monitor.mlflow_logger.flush()
        except Exception as e:  # the server: drop this point, try again later
            self.monitor.mlflow_logger.data = []
            self._drop_samples()
            self._retry_at = time.monotonic() + RETRY_AFTER_S
            if not self.failed:
                log.warning(
                    "MLflow system metrics: a write failed (%s); retrying in %.0fs", _why(e), RETRY_AFTER_S
                )
            self.failed = True

    def _drop_samples(self) -> None:
        for part in self.monitor.monitors:
            part.clear_metrics()

    def stop(self) -> None:
        """Stop sampling, wait for the thread, and log what was sampled since the last point."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(STOP_WAIT_S)
        if thread.is_alive():  # a write hangs past the HTTP timeouts: leave it (a daemon thread)
            log.warning("MLflow system metrics: the last write did not return in %.0fs", STOP_WAIT_S)
            return
        if self._sample():
            self._log_point()


def _why(e: Exception, limit: int = 300) -> str:
    text = redact(" ".join(f"{type(e).__name__}: {e}".split()))
    return text if len(text) <= limit else text[:limit] + "..."
