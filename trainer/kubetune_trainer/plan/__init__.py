"""The run plan (:mod:`.plan`: precision, kernels, recomputation, packing, micro-steps, sharding for
this hardware and spec) and the preflight estimate made with it on a CPU (:mod:`.estimate`); the
model's parameters, all and active (mixtures of experts), from its config alone (:mod:`.params`).

Imports :mod:`..settings` (and ``kubetune_api``); never a step's room.
"""
