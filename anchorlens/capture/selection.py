"""Which attention sites and heads to capture, TransformerLens-style filterable names.

``Site`` is re-exported from the adapters, which name every site of an architecture.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from anchorlens.models.adapters.site import Site


@dataclass(frozen=True)
class Selection:
    """Filter of sites and heads. None means all.

    stacks: stack names; layers: layer indices (negative counts from the end); heads: head indices;
    names: glob patterns over site names (``"decoder.*"``, ``"encoder.1[0-2]"``).
    """

    stacks: tuple[str, ...] | None = None
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    names: tuple[str, ...] | None = None

    def accepts(self, site: Site, num_layers: int) -> bool:
        """Whether ``site`` (in a stack of ``num_layers`` layers) is selected."""
        if self.stacks is not None and site.stack not in self.stacks:
            return False
        if self.layers is not None:
            wanted = {layer % num_layers for layer in self.layers}
            if site.layer not in wanted:
                return False
        if self.names is not None and not any(fnmatch.fnmatch(site.name, p) for p in self.names):
            return False
        return True


def parse_layers(text: str | None) -> tuple[int, ...] | None:
    """Parse ``"0,2,5-8,-1"`` into layer indices; None or ``"all"`` means all layers."""
    if text is None or text.strip().lower() in ("", "all"):
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part[1:]:
            lo, hi = part[0] + part[1:].split("-", 1)[0], part[1:].split("-", 1)[1]
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return tuple(out)
