"""The preparation step (``python -m kubetune_trainer.prepare``): on CPU, before any GPU pod, the model
and data are downloaded once, checked, tokenized and measured, the job's GPUs estimated, or the job
refused by name.

Imports the shared rooms (:mod:`..sources`, :mod:`..plan`, :mod:`..process`, :mod:`..settings`);
never :mod:`..training` or :mod:`..registration`.
"""
