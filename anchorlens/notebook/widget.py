"""What a notebook shows for attention maps: the interactive view of :mod:`anchorlens.views`, plus a static PNG.

No CDN, no network, no Jupyter extension. Where scripts run (a trusted notebook, a browser) the view replaces
the static image: a layer x head thumbnail grid to pick or combine heads, the map on a named colour scale,
hover a token to highlight its attention in and out, the text coloured by attention, and with two checkpoints
their difference. Where scripts are stripped (a saved or untrusted notebook, GitHub, nbconvert) the static PNG
stays, inside the HTML and as the bundle's ``image/png``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from anchorlens.capture.maps import AttentionMaps, StackMaps
from anchorlens.figures.maps import attention_map_figure
from anchorlens.figures.save import figure_to_png_bytes
from anchorlens.views.page import MapsArg, attention_view_html, stacks_of
from anchorlens.views.payload import MAX_BYTES

STATIC_DPI = 90  # the static PNG: readable, a few hundred KB at most


def widget_html(maps: StackMaps | AttentionMaps, title: str = "", fallback_png: bytes | None = None) -> str:
    """HTML of the interactive view of one checkpoint's ``maps``, showing ``fallback_png`` until a script runs."""
    return attention_view_html(maps, title=title, fallback_png=fallback_png)


def static_png(maps: Mapping[str, StackMaps], dpi: int = STATIC_DPI) -> bytes:
    """PNG of the mean map over layers and heads, one panel per checkpoint (what a saved notebook shows)."""
    return figure_to_png_bytes(attention_map_figure(dict(maps), layer="mean", head="mean"), dpi=dpi)


@dataclass
class AttentionView:
    """An interactive view of one example's maps from one or more checkpoints; displays itself in Jupyter.

    ``maps``: checkpoint name -> ``AttentionMaps``/``StackMaps`` of the same example (e.g. ``Comparison.maps``)
    or one of them. The bundle holds ``text/html`` (the view, with the static PNG inside for renderers that strip
    scripts), ``image/png`` (the same static map) and ``text/plain``."""

    maps: MapsArg
    stack: str | None = None
    title: str = ""
    max_bytes: int = MAX_BYTES
    layers: Sequence[int] | None = None
    _png: bytes | None = field(default=None, repr=False)

    def stacks(self) -> dict[str, StackMaps]:
        """checkpoint name -> the maps shown."""
        return stacks_of(self.maps, self.stack)

    def static_png(self) -> bytes:
        """The static PNG (cached)."""
        if self._png is None:
            self._png = static_png(self.stacks())
        return self._png

    def _repr_html_(self) -> str:
        return attention_view_html(
            self.stacks(),
            title=self.title,
            fallback_png=self.static_png(),
            max_bytes=self.max_bytes,
            layers=self.layers,
        )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        stacks = self.stacks()
        first = next(iter(stacks.values()))
        text = (
            f"AttentionView of {', '.join(n or 'maps' for n in stacks)}: {len(first.q_tokens)} x {len(first.k_tokens)} "
            f"tokens, {len(first.layers)} layers x {len(first.heads)} heads"
        )
        return {"text/html": self._repr_html_(), "image/png": self.static_png(), "text/plain": text}


def attention_view(
    maps: MapsArg,
    *,
    stack: str | None = None,
    title: str = "",
    max_bytes: int = MAX_BYTES,
    layers: Sequence[int] | None = None,
) -> AttentionView:
    """The notebook's interactive view of ``maps`` (see :class:`AttentionView`)."""
    return AttentionView(maps, stack=stack, title=title, max_bytes=max_bytes, layers=layers)
