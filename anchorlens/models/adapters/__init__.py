"""Architecture adapters: discovered from the loaded model, with overrides only where discovery cannot decide.

``adapter_for(model)`` runs the probe forward (:mod:`.probe`), reads the layout from what the model did
(:mod:`.discover`) and wraps it in a :class:`DiscoveredAdapter`; :data:`OVERRIDES` names the few model types whose
adapter adds a mechanism discovery cannot infer, each with its reason.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from anchorlens.models.adapters.base import ArchAdapter
from anchorlens.models.adapters.discover import Discovered, discover
from anchorlens.models.adapters.discovered import DiscoveredAdapter
from anchorlens.models.adapters.t5 import T5Adapter

# model_type -> (adapter class, why discovery alone cannot serve it)
OVERRIDES: dict[str, tuple[Callable[[Discovered], ArchAdapter], str]] = {
    "t5": (
        T5Adapter,
        "relative position bias computed in the first block and passed on: recomputed for inserted positions",
    ),
    "mt5": (
        T5Adapter,
        "relative position bias computed in the first block and passed on: recomputed for inserted positions",
    ),
}


def adapter_for(model: torch.nn.Module, found: Discovered | None = None) -> ArchAdapter:
    """The adapter of a loaded HF model: its discovered layout (``found``, or a probe forward now), or an override.

    UsageError (one line) when the model cannot be captured exactly (attention outside the interface, ...).
    """
    found = found if found is not None else discover(model)
    factory = OVERRIDES.get(found.model_type, (DiscoveredAdapter, ""))[0]
    return factory(found)


__all__ = ["OVERRIDES", "ArchAdapter", "Discovered", "DiscoveredAdapter", "T5Adapter", "adapter_for", "discover"]
