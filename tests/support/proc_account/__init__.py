"""CPU accounting of a test run, by kind of process: ``KUBETUNE_PROC_ACCOUNT=FILE hack/test.sh ...``
then ``python -m tests.support.proc_account FILE``. See ``sitecustomize.py`` in this folder."""

from .proc_account_core import ENV, append, kind, record_pid, summary

__all__ = ["ENV", "append", "kind", "record_pid", "summary"]
