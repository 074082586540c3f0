"""The job's checkpoint volume: checkpoints and their ``COMPLETE`` markers (:mod:`.checkpoints`),
the catalog of complete ones and what registration selects (:mod:`.catalog`), the ``spec.resume``
decision (:mod:`.resume`). No torch, no transformers: the operator's view and registration read it
too.

Imports only ``kubetune_api``.
"""
