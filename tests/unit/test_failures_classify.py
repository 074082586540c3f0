"""The trainer's classification of exceptions of the real types torch, huggingface_hub and the OS
raise (constructed here: a CPU cannot make CUDA or NCCL fail), and the termination message's
contract with the operator."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from kubetune_api.failures import (
    EXIT_FAILED,
    EXIT_RETRY,
    HINTS,
    MEANINGS,
    Failure,
    TrainingFailure,
    parse_failure,
)
from kubetune_trainer.failures import RunContext, classify


def _chained(outer: BaseException, cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise outer from inner
    except BaseException as e:
        return e


def test_every_reason_has_a_meaning_and_a_hint() -> None:
    assert set(MEANINGS) == set(HINTS) == set(Failure)


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (
            torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
            Failure.CUDA_OUT_OF_MEMORY,
        ),
        (
            torch.distributed.DistBackendError(
                "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"
            ),
            Failure.NCCL_ERROR,
        ),
        (
            RuntimeError(
                "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9) ran for 600000 ms"
            ),
            Failure.NCCL_TIMEOUT,
        ),
        (MemoryError(), Failure.HOST_OUT_OF_MEMORY),
        (
            RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
            Failure.HOST_OUT_OF_MEMORY,
        ),
        (
            _chained(
                RuntimeError("basic_ios::clear: iostream error"),
                OSError(errno.ENOSPC, "No space left on device"),
            ),
            Failure.DISK_FULL,
        ),
        (ValueError("something else entirely"), Failure.UNKNOWN),
    ],
)
def test_real_exception_types(exc: BaseException, reason: Failure, tmp_path: Path) -> None:
    got = classify(
        exc, RunContext(step=12, layout="8 rows x 1 micro-steps, no recomputation", output_dir=tmp_path)
    )
    assert got.reason == reason and got.step == 12
    assert got.exit_code == (EXIT_RETRY if got.retryable else EXIT_FAILED)


def test_cuda_oom_names_the_layout() -> None:
    got = classify(
        torch.cuda.OutOfMemoryError("CUDA out of memory"), RunContext(layout="8 rows x 1 micro-steps")
    )
    assert "micro-step 8 rows x 1 micro-steps" in got.message and got.retryable


def test_torch_stream_errors_are_disk_full_only_when_the_volume_is_full(tmp_path: Path) -> None:
    """torch's writer says 'unexpected pos' for a full disk, and for other write errors: only a volume
    with no room makes it DiskFull (this tmp folder has room)."""
    exc = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 156224 vs 156112")
    assert classify(exc, RunContext(output_dir=tmp_path)).reason == Failure.UNKNOWN


def test_a_checkpoint_that_cannot_be_read_is_corrupt_only_while_resuming(tmp_path: Path) -> None:
    exc = RuntimeError("Error while deserializing header: HeaderTooLarge")
    resuming = RunContext(resume_from=tmp_path / "checkpoint-40")
    assert classify(exc, resuming).reason == Failure.CHECKPOINT_CORRUPT
    assert "checkpoint-40" in classify(exc, resuming).message
    resuming.training_started = True
    assert classify(exc, resuming).reason == Failure.UNKNOWN


def test_the_unknown_failure_keeps_the_last_lines() -> None:
    def deep() -> None:
        raise KeyError("the_key_that_broke")

    try:
        deep()
    except KeyError as e:
        got = classify(e, RunContext())
    assert got.reason == Failure.UNKNOWN and "the_key_that_broke" in got.message and "deep()" in got.message


def test_the_termination_message_fits_4096_bytes_and_keeps_the_end() -> None:
    f = TrainingFailure.of(Failure.UNKNOWN, "x" * 10_000 + " THE END", step=3)
    text = f.termination_message()
    assert len(text.encode()) <= 4096
    back = parse_failure(f"some log line\n{text}\n")
    assert back is not None and back.reason == Failure.UNKNOWN and back.message.endswith("THE END")
    assert parse_failure("Traceback (most recent call last):\n  boom") is None
    assert parse_failure('{"failure": {"reason": "NotAReason", "message": "x"}}') is None
