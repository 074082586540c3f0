"""The registration step (``python -m kubetune_trainer.register``): the selected model logged into the
job's MLflow run and registered, once, under the evaluation gate, with its lineage tags.

Imports the shared rooms (:mod:`..sources`, :mod:`..volume`, :mod:`..mlflow`, :mod:`..settings`);
never :mod:`..preparation` or :mod:`..training`.
"""
