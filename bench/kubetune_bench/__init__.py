"""kubetune's benchmark harness: ``kubetune bench`` (see :mod:`kubetune_bench.bench`).

A tool of the repository, shipped in the wheel beside the CLI, not part of the trainer's runtime:
the trainer image does not carry it.
"""
