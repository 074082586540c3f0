"""The kubetune operator: a ``FineTuneJob`` in, a trained and registered model out.

Run it with ``python -m kubetune_operator`` (see ``__main__``). Modules, each doing one thing:

- ``settings``: the one config object, from ``KUBETUNE_*`` environment variables.
- ``builders``: pure functions from a FineTuneJob to child manifests (golden-file tested);
  its docstring lists the children, their fixed names, labels and the trainer identity.
- ``state``: the pure state machine (phases, conditions, reasons, events) and the registration
  result contract (the register pod's termination message).
- ``children``: idempotent ``ensure`` steps (create if missing, adopt only our own, report others).
- ``reconcile``: one pass for one FineTuneJob, run by every trigger.
- ``handlers``: every kopf decorator, thin.
- ``kube``: a small dict-in, dict-out API client.
- ``rbac``: exactly the API access the operator needs (for the Helm chart), proven by a test.
"""
