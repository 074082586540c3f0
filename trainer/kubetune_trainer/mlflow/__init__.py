"""MLflow: the job's one run that training and registration share, the tracking URI and the
redaction of credentials (:mod:`.run`), the retrying client (:mod:`.client`), training's tracker
(:mod:`.tracking`).

Imports :mod:`..settings` (and ``kubetune_api``); never a step's room. (Inside it ``import mlflow``
is MLflow itself: imports are absolute.)
"""
