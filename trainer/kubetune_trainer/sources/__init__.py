"""Where a job's model and data come from, shared by every step: the data's row-by-row check and its
loading (:mod:`.data_check`, :mod:`.data`; a new kind of data source goes there), the base model's
location (:mod:`.model`), a chained job's starting model (:mod:`.chain`), the ChatML template
(:mod:`.chat`), and what the preparation step left on the volume, read back (:mod:`.prepared`).

Imports :mod:`..mlflow`, :mod:`..settings` (and ``kubetune_api``); never a step's room.
"""
