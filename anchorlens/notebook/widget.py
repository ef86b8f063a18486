"""Offline HTML widget: an attention map drawn on a <canvas> by inline JS, with layer/head selectors.

No CDN, no network, no Jupyter extension: the probabilities travel inside the HTML as base64
uint8 (one byte per cell), so it also works in a saved notebook or a plain browser.
"""
from __future__ import annotations

import base64
import html
import json
import uuid

import numpy as np
import torch

from anchorlens.capture.maps import StackMaps
from anchorlens.figures._style import ROLE_COLORS, clean_token
from anchorlens.roles.kinds import Role

_JS = r"""
(function(){
 const root=document.getElementById(ROOT), D=DATA;
 const bytes=Uint8Array.from(atob(D.b64),c=>c.charCodeAt(0));
 const Q=D.q.length,K=D.k.length,V=D.heads.length+1, cell=Math.max(3,Math.min(16,Math.floor(560/Math.max(Q,K))));
 const pad=D.pad, cv=root.querySelector('canvas'), ctx=cv.getContext('2d'), tip=root.querySelector('.al-tip');
 cv.width=pad+K*cell+10; cv.height=pad+Q*cell+10;
 const L=root.querySelector('.al-layer'), H=root.querySelector('.al-head');
 function lut(t){const s=D.lut; const i=Math.min(s.length-1,Math.floor(t*(s.length-1))); return s[i];}
 function draw(){
  const li=+L.value, hi=+H.value, off=((li*V)+hi)*Q*K, sc=D.scale[li*V+hi];
  ctx.fillStyle='#fff'; ctx.fillRect(0,0,cv.width,cv.height);
  for(let q=0;q<Q;q++)for(let k=0;k<K;k++){const b=bytes[off+q*K+k];ctx.fillStyle=b?lut(b/255):'#fff';ctx.fillRect(pad+k*cell,pad+q*cell,cell,cell);}
  ctx.font=Math.max(7,Math.min(11,cell))+'px sans-serif'; ctx.textAlign='right'; ctx.textBaseline='middle';
  const step=Math.max(1,Math.ceil(9/cell));
  for(let q=0;q<Q;q+=step){ctx.fillStyle=D.colors[D.q[q][1]];ctx.fillText(D.q[q][0],pad-3,pad+q*cell+cell/2);}
  for(let k=0;k<K;k+=step){ctx.save();ctx.translate(pad+k*cell+cell/2,pad-3);ctx.rotate(-Math.PI/2);ctx.textAlign='left';
   ctx.fillStyle=D.colors[D.k[k][1]];ctx.fillText(D.k[k][0],0,0);ctx.restore();}
  root.querySelector('.al-scale').textContent='colour scale 0 – '+sc.toFixed(3);
 }
 cv.addEventListener('mousemove',e=>{const r=cv.getBoundingClientRect();const k=Math.floor((e.clientX-r.left-pad)/cell),q=Math.floor((e.clientY-r.top-pad)/cell);
  if(q<0||k<0||q>=Q||k>=K){tip.textContent='';return;} const li=+L.value,hi=+H.value,off=((li*V)+hi)*Q*K;
  tip.textContent=D.q[q][0]+' → '+D.k[k][0]+': '+(bytes[off+q*K+k]/255*D.scale[li*V+hi]).toFixed(3);});
 L.onchange=draw; H.onchange=draw; draw();
})();
"""


def _lut(n: int = 64) -> list[str]:
    """A viridis-like colour lookup table as CSS hex strings (low = light, high = dark)."""
    from matplotlib import colormaps

    cmap = colormaps["mako_r"] if "mako_r" in colormaps else colormaps["viridis_r"]
    return ["#%02x%02x%02x" % tuple(int(255 * c) for c in cmap(i / (n - 1))[:3]) for i in range(n)]


def _views(probs: torch.Tensor) -> np.ndarray:
    """[L, H+1, Q, K]: every head plus the head mean for every layer."""
    mean = probs.mean(dim=1, keepdim=True)
    return torch.cat([probs, mean], dim=1).numpy()


def widget_html(maps: StackMaps, title: str = "") -> str:
    """HTML (with inline JS) drawing ``maps`` with layer and head selectors; nothing loaded from the network."""
    views = _views(maps.probs.float())
    scale = views.reshape(views.shape[0] * views.shape[1], -1).max(axis=1).clip(min=1e-8)
    quant = np.round(views / scale.reshape(views.shape[0], views.shape[1], 1, 1) * 255).astype(np.uint8)
    data = {
        "b64": base64.b64encode(quant.tobytes()).decode("ascii"),
        "scale": scale.tolist(),
        "heads": maps.heads,
        "q": [[clean_token(t, mathtext=False), int(r)] for t, r in zip(maps.q_tokens, maps.q_roles.tolist())],
        "k": [[clean_token(t, mathtext=False), int(r)] for t, r in zip(maps.k_tokens, maps.k_roles.tolist())],
        "colors": [ROLE_COLORS.get(Role(i).label, "#333") for i in range(len(Role))],
        "lut": _lut(),
        "pad": 8 + 6 * max(len(clean_token(t, mathtext=False)) for t in [*maps.q_tokens, *maps.k_tokens, "x"]),
    }
    root = f"al-{uuid.uuid4().hex[:10]}"
    layers = "".join(f"<option value='{i}'>layer {layer}</option>" for i, layer in enumerate(maps.layers))
    heads = "".join(f"<option value='{i}'>head {h}</option>" for i, h in enumerate(maps.heads))
    heads += f"<option value='{len(maps.heads)}' selected>mean over heads</option>"
    legend = " ".join(
        f"<span style='color:{ROLE_COLORS.get(r.label, '#333')};font-weight:600'>■ {r.label}</span>" for r in Role
    )
    payload = json.dumps(data).replace("</", "<\\/")  # no early </script>
    script = _JS.replace("ROOT", json.dumps(root)).replace("DATA", payload)
    return (
        f"<div id='{root}' style='font-family:sans-serif;font-size:12px'>"
        f"<div><b>{html.escape(title)}</b></div>"
        f"<div>queries on rows, keys on columns · <select class='al-layer'>{layers}</select> "
        f"<select class='al-head'>{heads}</select> <span class='al-scale'></span></div>"
        f"<div>{legend}</div><canvas></canvas><div class='al-tip' style='height:1.2em;color:#333'></div>"
        f"<script>{script}</script></div>"
    )
