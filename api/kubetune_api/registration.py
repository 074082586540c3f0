"""The contract between the operator and the registration step (``python -m kubetune_trainer.register``)
beside its result JSON: the exit code of a gate not met, and the flag that forces a registration.

- Exit code ``EXIT_GATE_NOT_MET``: ``spec.registration.gate`` was not met, nothing was registered; the
  termination message is ``{"reason": "GateNotMet", "error": <both numbers in words>, "evaluation":
  <status.evaluation>}``. The registration Job's pod failure policy fails the Job at once on it (no
  retry: the same model does not meet the same gate twice), and the operator ends the FineTuneJob
  Succeeded with ``Registered=False``, reason ``GateNotMet``.
- ``FORCE_FLAG``: register even when the gate is not met: the operator puts it in the command of the
  registration Job that the ``kubetune.io/retry-registration`` annotation asks for after
  ``GateNotMet``. Never an environment variable: ``FORCE_ENV`` (what earlier versions read) is
  ignored by the trainer and refused in ``spec.env``.
"""

from __future__ import annotations

EXIT_GATE_NOT_MET = 5
FORCE_FLAG = "--force"
FORCE_ENV = "KUBETUNE_REGISTER_FORCE"
GATE_NOT_MET = "GateNotMet"
