"""The training engines a FineTuneJob runs on, and the custom resource each one is served as.

A job's engine is chosen once and recorded in ``status.engine`` (the operator's state machine,
``kubetune_operator.state.engine``): ``spec.engine`` forces one; otherwise the operator's default
(``KUBETUNE_ENGINE``: ``auto`` picks the first engine of :data:`AUTO_ORDER` whose resource the API
server serves).

>>> Engine.TRAINJOB.crd, Engine.PYTORCHJOB.api_version
('trainjobs.trainer.kubeflow.org', 'kubeflow.org/v1')
>>> parse_default("auto"), parse_default("TrainJob")
('auto', <Engine.TRAINJOB: 'TrainJob'>)
"""

from __future__ import annotations

from enum import StrEnum

AUTO = "auto"


class Engine(StrEnum):
    """What runs the training pods: the kind of the training object kubetune creates."""

    PYTORCHJOB = "PyTorchJob"  # Kubeflow Training Operator v1
    TRAINJOB = "TrainJob"  # Kubeflow Trainer v2 (on JobSet)

    @property
    def group(self) -> str:
        return _SERVED[self][0]

    @property
    def version(self) -> str:
        return _SERVED[self][1]

    @property
    def plural(self) -> str:
        return _SERVED[self][2]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def crd(self) -> str:
        """The CustomResourceDefinition's name (``<plural>.<group>``)."""
        return f"{self.plural}.{self.group}"

    @property
    def project(self) -> str:
        """What installs it."""
        return _SERVED[self][3]


# engine: (API group, version, plural, what installs it)
_SERVED = {
    Engine.PYTORCHJOB: ("kubeflow.org", "v1", "pytorchjobs", "the Kubeflow Training Operator v1"),
    Engine.TRAINJOB: ("trainer.kubeflow.org", "v1alpha1", "trainjobs", "Kubeflow Trainer v2"),
}

# ``auto``: the first of these whose resource the API server serves
AUTO_ORDER = (Engine.PYTORCHJOB, Engine.TRAINJOB)


def parse_default(value: str | None) -> Engine | str:
    """The operator's default engine (``KUBETUNE_ENGINE``): ``auto`` (unset too) or an engine's name."""
    if value is None or value == AUTO:
        return AUTO
    try:
        return Engine(value)
    except ValueError:
        choices = ", ".join([AUTO, *Engine])
        raise ValueError(f"KUBETUNE_ENGINE={value!r}: expected one of {choices}") from None
