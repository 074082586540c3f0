"""The registration claim: one registration at a time per output folder.

:class:`RegistrationClaim` is the ``flock`` on ``<output_dir>/register.lock`` under which
:mod:`kubetune_trainer.register` does its whole step; see there for why exactly once needs it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_CLAIM_WAIT_S = 3600.0  # register --claim-wait's default (never from the environment)
log = logging.getLogger("kubetune_trainer.register")

CLAIM_FILE = "register.lock"
CLAIM_POLL_S = 1.0
# flock(2) errors that mean "this file system keeps no locks", not "someone else holds it"
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})


class ClaimError(RuntimeError):
    """The registration claim could not be taken in time, or was lost while registering."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class RegistrationClaim:
    """The right to register the model of one output folder: ``flock`` on ``<output_dir>/register.lock``.

    MLflow has no compare-and-swap (tags, aliases and searches are last-writer-wins; versions are
    numbered, not unique per run), so two processes that both look and then write each make a run,
    a logged model and a version. Every registration of a job reads the final model from the job's
    checkpoint volume, so the claim lives there: an exclusive ``flock`` on a file that is never
    deleted (deleting it would let a waiter lock the old file while a newcomer locks a new one).

    * Only one process holds it; the others wait (polling, up to ``wait_s``), then find what the
      holder registered (every MLflow step looks before it writes).
    * The kernel drops the lock when its holder ends, however it ends (SIGKILL, OOM), so a claim is
      never left behind and nothing expires while a live holder slowly uploads a large model. The
      file records the holder (host, which is the pod's name, and pid) for the messages, and
      ``released`` on a clean release: a taker that finds it false says the previous holder died.
    * Where locks reach: one node always (an RWO volume is attached to one node; two pods there
      share the kernel's locks); across nodes on NFSv4, NFSv3 with lockd, CephFS and the like.
      An NFSv4 client cut off from its server past the lease (90 s by default) loses the lock, and
      then (Linux's default, ``nfs.recover_lost_locks=0``) reads and writes through it fail with
      EIO: :meth:`verify`, which rewrites the record before each MLflow write that creates
      something, turns that into :class:`ClaimError` instead of a second registration. (A loss
      in the middle of one long write, the model upload, is seen at the next check, before the
      version is created.)
    * A file system that refuses locks (``ENOLCK``, ``EOPNOTSUPP``): a warning, and registration
      goes on without a claim (the Job's ``podReplacementPolicy: Failed`` still keeps its pods
      from overlapping). A mount that keeps locks per node (NFS ``nolock`` or ``local_lock``)
      cannot be told apart: there, pods on different nodes are not excluded.
    """

    def __init__(
        self,
        output_dir: Path,
        wait_s: float = DEFAULT_CLAIM_WAIT_S,
        *,
        poll_s: float = CLAIM_POLL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.path = Path(output_dir) / CLAIM_FILE
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.clock = clock
        self.sleep = sleep
        self.fd: int | None = None
        self.exclusive = False  # False where the file system keeps no locks
        self.holder = {"host": socket.gethostname(), "pid": os.getpid()}

    def __enter__(self) -> RegistrationClaim:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def read_holder(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @staticmethod
    def describe(holder: dict[str, Any]) -> str:
        if not holder:
            return "another registration process"
        return f"{holder.get('host', '?')} pid {holder.get('pid', '?')} (since {holder.get('since', '?')})"

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = self.clock() + self.wait_s
        waiting = False
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o664)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = self.describe(self.read_holder())
                left = deadline - self.clock()
                if left <= 0:
                    raise ClaimError(
                        f"another registration of this model ({holder}) held {self.path} for the whole "
                        f"{self.wait_s:g}s this one waits (register --claim-wait); it is still running",
                        "RegistrationInProgress",
                    ) from None
                if not waiting:
                    log.info("%s is registering this model; waiting for it to finish", holder)
                    waiting = True
                self.sleep(min(self.poll_s, left))
                continue
            except OSError as exc:
                os.close(fd)
                if exc.errno not in _NO_LOCKS:
                    raise
                log.warning(
                    "%s: the file system keeps no locks (%s); registering without a claim, so a "
                    "registration running at the same time elsewhere is not excluded",
                    self.path,
                    exc.strerror,
                )
                return
            if not self._is_current(fd):
                os.close(fd)  # the file was deleted or replaced meanwhile: lock the one now there
                continue
            break
        self.fd, self.exclusive = fd, True
        previous = self.read_holder()
        if previous and previous.get("released") is False:
            log.warning(
                "the previous registration (%s) ended without releasing its claim (killed?); taking over",
                self.describe(previous),
            )
        if waiting:
            log.info("%s is done; looking for what it registered", self.describe(previous))
        self.holder["since"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._write(released=False)

    def _is_current(self, fd: int) -> bool:
        try:
            now = self.path.stat()
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)

    def _write(self, *, released: bool) -> None:
        assert self.fd is not None
        data = json.dumps({**self.holder, "released": released}, sort_keys=True).encode() + b"\n"
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)
        os.fsync(self.fd)

    def verify(self, what: str) -> None:
        """Before each MLflow write: the claim is still this process's (file in place, lock alive)."""
        if self.fd is None:
            return
        try:
            if not self._is_current(self.fd):
                raise OSError(errno.ESTALE, "the claim file was deleted or replaced")
            self._write(released=False)
        except OSError as exc:
            raise ClaimError(
                f"lost the registration claim {self.path} before it could {what} ({exc.strerror or exc}); "
                "another registration may have taken over, so this one stops (a retry finds what "
                "was registered)",
                "ClaimLost",
            ) from exc

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self._write(released=True)
        except OSError as exc:
            log.warning("could not mark the claim %s released: %s", self.path, exc)
        finally:
            os.close(self.fd)  # drops the lock
            self.fd = None
