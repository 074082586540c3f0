"""One training process (``python -m kubetune_trainer.train``, one per GPU under
``python -m kubetune_trainer.launch``): the model, data and TRL trainer built as the plan says, the
hooks into the training loop (checkpoints, preemption, budgets, loss watchdog, progress), the fast
path's kernels, and the failures classified for the operator.

Imports the shared rooms (:mod:`..sources`, :mod:`..plan`, :mod:`..volume`, :mod:`..mlflow`,
:mod:`..process`, :mod:`..settings`); never :mod:`..preparation` or :mod:`..registration`.
"""
