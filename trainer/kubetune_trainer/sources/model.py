"""Where the base model is loaded from: the model the preparation step downloaded onto the volume,
the spec's path, the Hub, or a chained job's starting model (:mod:`.chain`). Training loads it from
here, registration loads the base of a LoRA adapter from here.
"""

from __future__ import annotations

from typing import Any

from kubetune_api.trainer_config import TrainerConfig

from .. import settings
from . import chain
from .prepared import prepared


def model_source(cfg: TrainerConfig) -> tuple[str, dict[str, Any]]:
    """Where to load the base model from, and the loading arguments that depend on the source: the
    model the preparation step downloaded onto the volume, the spec's path, or the Hub. A chained
    job (spec.model.fromJob or registered): its starting model (:mod:`.chain`: a parent's full model,
    a parent's adapter merged into its base, a registered version), with its tokenizer."""
    src = cfg.spec.model
    if chain.is_chained(cfg):
        return str(chain.ensure_start(cfg).folder), {}
    found = prepared(cfg)
    if found is not None and found.model_dir is not None:
        return str(found.model_dir), {}
    if src.path:
        return src.path, {}
    assert src.name is not None  # the spec guarantees exactly one of name/path
    return src.name, {"revision": src.revision, "token": settings.current().hf_token}
