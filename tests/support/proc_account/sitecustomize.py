"""Where the suite's CPU goes: on ``KUBETUNE_PROC_ACCOUNT``, each Python process of a test run (pytest,
the operator, the MLflow server, the pods' trainer steps, the local CLI) appends one line to that file
when it exits: what it was (:func:`proc_account_core.kind`, from its command line: never its
arguments' values), its CPU seconds and wall seconds, and which heavy libraries it imported.

hack/test.sh puts this folder on ``PYTHONPATH`` when ``KUBETUNE_PROC_ACCOUNT`` is set, and the pod
runner passes both to the pods' processes; ``python -m tests.support.proc_account FILE`` sums it up.
A process killed by a signal (SIGKILL, or SIGTERM without a handler that exits) writes nothing: the
launchers that kill theirs record them instead (:func:`proc_account_core.record_pid`).
"""

import os

if os.environ.get("KUBETUNE_PROC_ACCOUNT"):
    import atexit
    import sys
    import time

    _started = time.time()

    def _record() -> None:
        try:
            from proc_account_core import append, kind  # this folder is on PYTHONPATH

            times = os.times()
            append(
                kind(sys.argv, sys.orig_argv),
                cpu=times.user + times.system,
                wall=time.time() - _started,
                modules=sys.modules,
            )
        except Exception:  # a measurement never fails a process
            pass

    atexit.register(_record)
