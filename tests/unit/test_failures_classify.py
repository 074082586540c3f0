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
from kubetune_trainer.training.failures import RunContext, classify


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


@pytest.mark.parametrize(
    ("message", "reason", "kept"),
    [
        ("строка 17: " + "ж" * 3000, Failure.DATASET_ERROR, "строка 17"),  # a bad row: its start
        ('"' * 10_000 + " THE END", Failure.UNKNOWN, "THE END"),  # escaped quotes count double
        ("\U0001f600" * 5_000 + " THE END", Failure.UNKNOWN, "THE END"),  # 4-byte characters
        ("\udcff" + "y" * 5_000 + " THE END", Failure.UNKNOWN, "THE END"),  # a lone surrogate
    ],
)
def test_the_termination_message_keeps_what_matters_whatever_the_bytes(
    message: str, reason: Failure, kept: str
) -> None:
    text = TrainingFailure.of(reason, message, step=3).termination_message()
    assert len(text.encode()) <= 4096 and "\n" not in text
    back = parse_failure(text)
    assert back is not None and back.reason == reason and kept in back.message
    assert len(back.message) > 900  # shortened to fit, not thrown away


def test_a_short_message_with_a_lone_surrogate_is_escaped_not_an_error() -> None:
    text = TrainingFailure.of(Failure.DATASET_ERROR, "file b'\\xff' \udcff row 3").termination_message()
    back = parse_failure(text)
    assert back is not None and "row 3" in back.message


def test_credentials_never_reach_the_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Whatever an exception quotes: the token's value, a tracking URI's user:password@ (also with an
    "@" in the password), a ?token= in a URL; in the classified message, the termination file and
    the log line."""
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETsecretSECRET123")
    term = tmp_path / "termination-log"
    from kubetune_trainer.training import failures

    monkeypatch.setattr(failures, "_explicit_termination_log", [term])  # train --termination-log
    exc = _chained(
        RuntimeError("API request to https://alice:s3c@ret@mlflow.example.com/api/2.0 failed"),
        OSError("GET https://hub.example.com/x?token=hf_other_value&b=1 as hf_SECRETsecretSECRET123"),
    )
    got = classify(exc, RunContext())
    failures.report(got)
    for text in (got.message, term.read_text()):
        for secret in ("hf_SECRETsecretSECRET123", "s3c", "ret@", "hf_other_value"):
            assert secret not in text, (secret, text)
        assert "mlflow.example.com" in text
    # the operator's side: a failure read from anywhere is scrubbed by the model itself
    back = TrainingFailure.model_validate({"reason": "Unknown", "message": "see https://u:pw@h.example/x"})
    assert "pw" not in back.message and "https://***@h.example/x" in back.message


def test_a_row_that_quotes_an_error_is_a_dataset_error() -> None:
    """The trainer's own check names the row; the row's text does not decide the reason."""
    from kubetune_trainer.sources.data_check import BadInputError

    for words in ("CUDA out of memory", "No space left on device", "NCCL timeout"):
        got = classify(BadInputError(f"row 12: the assistant turn is empty: '{words}'"), RunContext())
        assert got.reason == Failure.DATASET_ERROR, words
    got = classify(RuntimeError("CUDA error: out of memory"), RunContext())
    assert got.reason == Failure.CUDA_OUT_OF_MEMORY


def test_outside_a_pod_no_termination_file_is_made(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kubetune_trainer.training import failures

    missing = tmp_path / "dev" / "termination-log"
    monkeypatch.setenv("KUBETUNE_TERMINATION_LOG", str(tmp_path / "elsewhere"))  # ignored
    monkeypatch.setattr(failures, "_explicit_termination_log", [])  # no --termination-log
    monkeypatch.setattr(failures, "DEFAULT_TERMINATION_LOG", str(missing))
    (tmp_path / "dev").mkdir()
    failures.write_termination_log("x")
    assert not missing.exists()
    missing.write_text("")  # the kubelet made it: written
    failures.write_termination_log("x")
    assert missing.read_text() == "x" and not (tmp_path / "elsewhere").exists()
