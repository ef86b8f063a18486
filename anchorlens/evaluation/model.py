"""What evaluation and training take: a GuidedModel (a Base is a GuidedModel without guidance)."""

from __future__ import annotations

import torch

from anchorlens.methods.guided import GuidedModel
from anchorlens.models.base import Base

# forward(batch).logits: [B, T, V] for decoder-only bases (T = batch.input_ids positions) and
# [B, S, V] for encoder-decoder bases (S = batch.target_ids positions).
Scorable = GuidedModel


def as_model(obj: Base | GuidedModel) -> GuidedModel:
    """A GuidedModel as is; a Base as ``GuidedModel(base)``; anything else is a TypeError (no duck typing)."""
    if isinstance(obj, GuidedModel):
        return obj
    if isinstance(obj, Base):
        return GuidedModel(obj)
    raise TypeError(f"expected a Base or a GuidedModel (see anchorlens.methods.load_guided), got {type(obj).__name__}")


def model_device(model: GuidedModel) -> torch.device:
    """The device batches must be moved to."""
    return model.device
