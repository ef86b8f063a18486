"""What evaluation and training need from a model: ``.base`` and ``.forward(batch)``."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from anchorlens.models.base import Base
from anchorlens.roles.encoding import Encoded


@runtime_checkable
class Scorable(Protocol):
    """A (guided or plain) model whose ``forward`` returns logits aligned to the batch's positions.

    forward(batch).logits: [B, T, V] for decoder-only bases (T = batch.input_ids positions) and
    [B, S, V] for encoder-decoder bases (S = batch.target_ids positions).
    """

    base: Base

    def forward(self, batch: Encoded) -> Any:
        """Run the model on ``batch``."""
        ...


class PlainModel:
    """A base model without guidance, behind the same interface as a GuidedModel."""

    def __init__(self, base: Base) -> None:
        """Wrap ``base``."""
        self.base = base

    @property
    def device(self) -> torch.device:
        """Device of the base's parameters."""
        return self.base.device

    def forward(self, batch: Encoded) -> Any:
        """The base's HF output for ``batch``."""
        return self.base.forward(batch)

    def config(self) -> dict:
        """Method description for manifests."""
        return {"method": "none"}


def as_model(obj: Any) -> Scorable:
    """A Base becomes a PlainModel; a GuidedModel (anything with ``.base`` and ``.forward``) passes."""
    if isinstance(obj, Base):
        return PlainModel(obj)
    if not (hasattr(obj, "base") and hasattr(obj, "forward")):
        raise TypeError(f"expected a Base or a guided model, got {type(obj).__name__}")
    return obj


def model_device(model: Scorable) -> torch.device:
    """The device batches must be moved to."""
    device = getattr(model, "device", None)
    return torch.device(device) if device is not None else model.base.device
