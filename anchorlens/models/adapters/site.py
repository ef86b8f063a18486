"""An attention call site: which stack and which layer an attention module serves."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Site:
    """One attention call site: a stack (``decoder``, ``encoder``, ``cross``) and a layer index."""

    stack: str
    layer: int

    @property
    def name(self) -> str:
        """Hook-point style name, e.g. ``decoder.3``."""
        return f"{self.stack}.{self.layer}"
