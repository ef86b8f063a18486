"""An offline, interactive attention view: one HTML fragment with its data, style and script inline.

    html = attention_view_html({"base": maps_a, "instance": maps_b}, title="example 3")

What it shows (where scripts run; a static image otherwise):

- the map of the chosen heads (queries on rows, keys on columns) on one named colour scale for every layer, head
  and checkpoint (linear / sqrt / log), with a colour bar; masked cells (the causal upper triangle) and fully
  masked query rows hatched as n/a, never as a value;
- a layer x head grid of thumbnails (plus each layer's and each head's mean and the mean over all): click one to
  show it, shift/ctrl-click to add or remove heads (the map shows their mean), "mean over all" to reset;
- hover a token (on the map's axes or in the text) to highlight its attention out (its row, as a query) and in
  (its column, as a key); click pins it;
- the text coloured by the attention from (or to) the chosen token, or from (to) a chosen role, roles underlined;
- with two or more checkpoints, the difference A − B on the positions they share (aligned by role and token;
  inserted guidance positions have no counterpart and are dotted), on a diverging scale symmetric around 0.

Everything is drawn on canvases (no element per cell); maps travel quantised and compressed
(:mod:`anchorlens.views.data`), within a size budget (:mod:`anchorlens.views.payload`). No CDN, no request.
"""

from __future__ import annotations

import base64
import html
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from anchorlens.capture.maps import AttentionMaps, StackMaps
from anchorlens.figures._style import DIFF_CMAP, MAP_CMAP
from anchorlens.views._script import SCRIPT
from anchorlens.views.data import CODE_MAX
from anchorlens.views.payload import MAX_BYTES, view_payload

LOG_FLOOR = 1e-4  # the log scale spans [vmax * LOG_FLOOR, vmax]
MAX_PX = 640  # the map is drawn at most about this many pixels across (at least one pixel per cell)

MapsArg = Mapping[str, AttentionMaps | StackMaps] | AttentionMaps | StackMaps

_STYLE = """
#ID{font-family:sans-serif;font-size:12px;color:#222}
#ID .alv-bar{display:flex;flex-wrap:wrap;gap:6px;align-items:center;margin:4px 0}
#ID .alv-row{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
#ID .alv-main{display:flex;flex-wrap:nowrap;gap:12px;align-items:flex-start;min-width:0;flex:1 1 520px}
#ID .alv-mapbox{position:relative;overflow:auto;min-width:0;max-height:900px}
#ID .alv-over{position:absolute;left:0;top:0;cursor:crosshair}
#ID .alv-thumbs{display:grid;gap:2px;align-items:center;font-size:10px;max-height:660px;overflow:auto}
#ID .alv-th{width:34px;height:34px;image-rendering:pixelated;cursor:pointer;outline:1px solid #ddd}
#ID .alv-th.alv-on{outline:2px solid #c00}
#ID .alv-th-l{text-align:center;color:#555}
#ID .alv-text{line-height:1.9;max-height:320px;overflow:auto;border:1px solid #ddd;padding:6px;white-space:pre-wrap}
#ID .alv-tok{padding:1px 0;margin-right:1px;cursor:pointer}
#ID .alv-tip{min-height:1.3em;color:#333}
#ID .alv-note{color:#a33}
#ID .alv-cbname,#ID .alv-tname{color:#444;font-style:italic}
"""


def _lut(cmap: str, n: int = 256) -> list[str]:
    """A colour map as ``n`` CSS hex strings (low to high)."""
    import seaborn  # noqa: F401  (registers mako_r and vlag)
    from matplotlib import colormaps

    c = colormaps[cmap]
    return ["#" + "".join(f"{round(255 * x):02x}" for x in c(i / (n - 1))[:3]) for i in range(n)]


def stacks_of(maps: MapsArg, stack: str | None = None) -> dict[str, StackMaps]:
    """checkpoint name -> StackMaps of ``stack`` (default: each one's default stack) from any accepted input."""
    if isinstance(maps, (AttentionMaps, StackMaps)):
        maps = {"": maps}
    out: dict[str, StackMaps] = {}
    for name, m in maps.items():
        out[str(name)] = m[stack or m.default_stack] if isinstance(m, AttentionMaps) else m
    if not out:
        raise ValueError("attention_view_html: no maps given")
    return out


@dataclass
class Fragment:
    """The parts of a view: its DOM id, the HTML fragment and the JSON data it carries."""

    root: str
    html: str
    data: dict


def view_fragment(
    maps: MapsArg,
    *,
    stack: str | None = None,
    title: str = "",
    fallback_png: bytes | None = None,
    max_bytes: int = MAX_BYTES,
    layers: Sequence[int] | None = None,
) -> Fragment:
    """The view of ``maps`` (see :func:`attention_view_html`) with its id and data (for tests and embedding)."""
    stacks = stacks_of(maps, stack)
    data = view_payload(stacks, max_bytes=max_bytes, layers=layers)
    data.update(lut=_lut(MAP_CMAP), dlut=_lut(DIFF_CMAP), log_floor=LOG_FLOOR, max_px=MAX_PX, code_max=CODE_MAX)
    root = f"alv-{uuid.uuid4().hex[:12]}"
    static = ""
    if fallback_png is not None:
        src = base64.b64encode(fallback_png).decode("ascii")
        static = f"<img alt='{html.escape(title)} (static)' src='data:image/png;base64,{src}' style='max-width:100%'>"
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")  # no early </script>
    script = SCRIPT.replace("ROOT", json.dumps(root)).replace("DATA", payload)
    scales = "".join(f"<option{' selected' if s == 'sqrt' else ''}>{s}</option>" for s in ("linear", "sqrt", "log"))
    body = (
        f"<div id='{root}' class='anchorlens-view'><style>{_STYLE.replace('#ID', '#' + root)}</style>"
        f"<div><b>{html.escape(title)}</b></div>"
        f"<div class='alv-static'>{static}</div>"
        "<div class='alv-live' style='display:none'>"
        "<div class='alv-bar'>"
        "<label>checkpoint <select class='alv-a'></select></label>"
        "<span class='alv-cmp'><label>view <select class='alv-mode'><option value='map'>map</option>"
        "<option value='diff'>difference A − B</option></select></label> "
        "<label>B <select class='alv-b'></select></label></span>"
        f"<label>scale <select class='alv-scale'>{scales}</select></label>"
        "<button type='button' class='alv-all'>mean over all</button>"
        "<span class='alv-note'></span></div>"
        "<div class='alv-what'></div>"
        "<div class='alv-row'>"
        "<div><div class='alv-th-l'>layer × head (click: show · shift-click: add/remove)</div>"
        "<div class='alv-thumbs'></div></div>"
        "<div class='alv-main'><div style='min-width:0'>"
        "<div class='alv-mapbox'><canvas class='alv-map'></canvas><canvas class='alv-over'></canvas></div>"
        "<div class='alv-tip'></div></div>"
        "<div><canvas class='alv-cbar' width='150' height='300'></canvas>"
        "<div class='alv-cbname' style='max-width:150px'></div></div></div></div>"
        "<div class='alv-bar'>text coloured by <select class='alv-dir'>"
        "<option value='from'>attention from (the focus as query)</option>"
        "<option value='to'>attention to (the focus as key)</option></select>"
        "<label>focus <select class='alv-role'><option value='-1'>token under the mouse (click pins)</option>"
        "</select></label><button type='button' class='alv-unpin'>unpin</button></div>"
        "<div class='alv-bar'><canvas class='alv-tbar' width='260' height='26'></canvas>"
        "<span class='alv-tname'></span></div>"
        "<div class='alv-text'></div>"
        "</div>"
        f"<script>{script}</script></div>"
    )
    return Fragment(root, body, data)


def attention_view_html(
    maps: MapsArg,
    *,
    stack: str | None = None,
    title: str = "",
    fallback_png: bytes | None = None,
    max_bytes: int = MAX_BYTES,
    layers: Sequence[int] | None = None,
) -> str:
    """An HTML fragment (all script and style inline, a unique DOM id, no request) viewing the attention maps of
    one example from one or more checkpoints.

    ``maps``: checkpoint name -> ``AttentionMaps`` (or ``StackMaps``) of the same example, e.g. ``compare``'s
    ``Comparison.maps``; one ``AttentionMaps``/``StackMaps`` alone is a view of one checkpoint. ``stack``: which
    stack (default: each one's default). ``fallback_png``: an image shown where scripts do not run (a saved
    notebook). ``max_bytes``/``layers``: how many maps are sent at full resolution, and which layers' heads first
    (see :func:`anchorlens.views.payload.view_payload`); the others are shown from their thumbnails, and say so."""
    return view_fragment(
        maps, stack=stack, title=title, fallback_png=fallback_png, max_bytes=max_bytes, layers=layers
    ).html
