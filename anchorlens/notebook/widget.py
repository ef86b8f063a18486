"""Offline HTML view of an attention map: a <canvas> drawn by inline JS, plus a static PNG fallback.

No CDN, no network, no Jupyter extension. Where scripts run (a trusted notebook, a browser) the
canvas replaces the static image and offers layer (default: mean over layers), head (default: mean
over heads) and colour scale (linear / sqrt / log) selectors, a colour bar and hover values. Where
scripts are stripped (a saved or untrusted notebook, GitHub, nbconvert) the static PNG stays.

Values travel as base64 uint16 on one scale shared by every view (sqrt-coded, so values down to
~1e-9 of the largest stay non-zero); masked cells (the causal upper triangle) are sent as a flag and
drawn hatched grey, never as a colour of the scale.
"""

from __future__ import annotations

import base64
import html
import json
import uuid

import numpy as np
import torch

from anchorlens.capture.maps import StackMaps
from anchorlens.figures._roles import role_palette
from anchorlens.figures._style import MAP_CMAP, clean_token

CODE_MAX = 65535
LOG_FLOOR = 1e-4  # the log scale spans [max * LOG_FLOOR, max]

_JS = r"""
(function(){
 const root=document.getElementById(ROOT), D=DATA;
 const raw=Uint8Array.from(atob(D.b64),c=>c.charCodeAt(0)), codes=new Uint16Array(raw.buffer);
 const Q=D.q.length,K=D.k.length,NL=D.layers.length+1,NH=D.heads.length+1;
 const cell=Math.max(3,Math.min(16,Math.floor(560/Math.max(Q,K)))), pad=D.pad;
 const cv=root.querySelector('canvas'), ctx=cv.getContext('2d'), tip=root.querySelector('.al-tip');
 const cb=root.querySelector('.al-cbar'), cbx=cb.getContext('2d');
 root.querySelector('.al-static').style.display='none'; root.querySelector('.al-live').style.display='block';
 cv.width=pad+K*cell+10; cv.height=pad+Q*cell+10;
 const L=root.querySelector('.al-layer'), H=root.querySelector('.al-head'), S=root.querySelector('.al-scale');
 const hatch=(()=>{const p=document.createElement('canvas');p.width=p.height=6;const c=p.getContext('2d');
  c.fillStyle='#e4e4e4';c.fillRect(0,0,6,6);c.strokeStyle='#b0b0b0';c.beginPath();c.moveTo(0,6);c.lineTo(6,0);c.stroke();
  return ctx.createPattern(p,'repeat');})();
 function value(off,i){const c=codes[off+i]/D.code_max; return c*c*D.vmax;}
 function frac(v){const s=S.value; if(v<=0) return 0;
  if(s==='linear') return v/D.vmax; if(s==='sqrt') return Math.sqrt(v/D.vmax);
  const lo=D.vmax*D.log_floor; return Math.max(0,Math.min(1,Math.log(v/lo)/Math.log(D.vmax/lo)));}
 function lut(t){const n=D.lut.length; return D.lut[Math.min(n-1,Math.max(0,Math.round(t*(n-1))))];}
 function masked(q,k){return D.causal&&k>q;}
 function colorbar(){const w=cb.width,h=cb.height,bar=h-20;cbx.clearRect(0,0,w,h);
  for(let y=0;y<bar;y++){cbx.fillStyle=lut(1-y/(bar-1));cbx.fillRect(0,y+8,14,1);}
  cbx.fillStyle='#222';cbx.font='11px sans-serif';cbx.textBaseline='middle';
  const s=S.value, lo=s==='log'?D.vmax*D.log_floor:0;
  const ticks=s==='log'?[lo,Math.sqrt(lo*D.vmax),D.vmax]:s==='sqrt'?[0,D.vmax/16,D.vmax/4,D.vmax]:[0,D.vmax/2,D.vmax];
  for(const t of ticks){const y=8+(1-frac(Math.max(t,1e-30)))*(bar-1);cbx.fillRect(14,y,4,1);
   cbx.fillText((s==='log'||t===0)?t.toPrecision(2):t.toFixed(3),21,y);}
  cbx.fillStyle='#b0b0b0';cbx.fillRect(0,h-8,14,8);cbx.fillStyle='#222';cbx.fillText('masked',21,h-4);}
 function draw(){
  const off=((+L.value)*NH+(+H.value))*Q*K;
  ctx.fillStyle='#fff'; ctx.fillRect(0,0,cv.width,cv.height);
  for(let q=0;q<Q;q++)for(let k=0;k<K;k++){
   ctx.fillStyle=masked(q,k)?hatch:lut(frac(value(off,q*K+k)));ctx.fillRect(pad+k*cell,pad+q*cell,cell,cell);}
  ctx.font=Math.max(7,Math.min(11,cell))+'px sans-serif'; ctx.textAlign='right'; ctx.textBaseline='middle';
  const step=Math.max(1,Math.ceil(9/cell));
  for(let q=0;q<Q;q+=step){ctx.fillStyle=D.colors[D.q[q][1]];ctx.fillText(D.q[q][0],pad-3,pad+q*cell+cell/2);}
  for(let k=0;k<K;k+=step){ctx.save();ctx.translate(pad+k*cell+cell/2,pad-3);ctx.rotate(-Math.PI/2);ctx.textAlign='left';
   ctx.fillStyle=D.colors[D.k[k][1]];ctx.fillText(D.k[k][0],0,0);ctx.restore();}
  colorbar();
 }
 cv.addEventListener('mousemove',e=>{const r=cv.getBoundingClientRect();const k=Math.floor((e.clientX-r.left-pad)/cell),q=Math.floor((e.clientY-r.top-pad)/cell);
  if(q<0||k<0||q>=Q||k>=K){tip.textContent='';return;} const off=((+L.value)*NH+(+H.value))*Q*K;
  tip.textContent=D.q[q][0]+' → '+D.k[k][0]+': '+(masked(q,k)?'masked':value(off,q*K+k).toPrecision(3));});
 L.onchange=draw; H.onchange=draw; S.onchange=draw; draw();
})();
"""


def _lut(n: int = 128) -> list[str]:
    """The figures' colour map (low = light, high = dark) as CSS hex strings."""
    import seaborn  # noqa: F401  (registers mako_r)
    from matplotlib import colormaps

    cmap = colormaps[MAP_CMAP]
    return ["#" + "".join(f"{int(255 * c):02x}" for c in cmap(i / (n - 1))[:3]) for i in range(n)]


def views(probs: torch.Tensor) -> np.ndarray:
    """[L+1, H+1, Q, K] from probs [L, H, Q, K]: every layer and head, plus head means (last head
    slot) and layer means (last layer slot)."""
    p = probs.double()
    with_heads = torch.cat([p, p.mean(dim=1, keepdim=True)], dim=1)
    return torch.cat([with_heads, with_heads.mean(dim=0, keepdim=True)], dim=0).numpy()


def encode(values: np.ndarray) -> tuple[np.ndarray, float]:
    """(uint16 codes, vmax): one shared scale, sqrt-coded (value = (code / CODE_MAX)^2 * vmax)."""
    vmax = float(values.max()) if values.size and values.max() > 0 else 1.0
    codes = np.round(np.sqrt(np.clip(values, 0.0, None) / vmax) * CODE_MAX).astype("<u2")
    return codes, vmax


def decode(codes: np.ndarray, vmax: float) -> np.ndarray:
    """Inverse of :func:`encode` (what the browser shows)."""
    return (codes.astype(np.float64) / CODE_MAX) ** 2 * vmax


def is_causal(probs: torch.Tensor) -> bool:
    """True when every map is square with an all-zero strict upper triangle (a causal mask)."""
    q, k = probs.shape[-2:]
    return q == k and q > 1 and not torch.triu(probs, diagonal=1).any().item()


def widget_html(maps: StackMaps, title: str = "", fallback_png: bytes | None = None) -> str:
    """HTML with an inline-JS canvas view of ``maps`` and, shown until a script runs, ``fallback_png``."""
    v = views(maps.probs)
    codes, vmax = encode(v)
    palette = role_palette(maps.role_names)  # the figures' colours: fixed for built-ins, fallback for task roles
    data = {
        "b64": base64.b64encode(codes.tobytes()).decode("ascii"),
        "code_max": CODE_MAX,
        "vmax": vmax,
        "log_floor": LOG_FLOOR,
        "causal": is_causal(maps.probs),
        "layers": list(maps.layers),
        "heads": list(maps.heads),
        "q": [[clean_token(t, mathtext=False), int(r)] for t, r in zip(maps.q_tokens, maps.q_roles.tolist())],
        "k": [[clean_token(t, mathtext=False), int(r)] for t, r in zip(maps.k_tokens, maps.k_roles.tolist())],
        "colors": [palette[name] for name in maps.role_names],
        "lut": _lut(),
        "pad": 8 + 6 * max(len(clean_token(t, mathtext=False)) for t in [*maps.q_tokens, *maps.k_tokens, "x"]),
    }
    root = f"al-{uuid.uuid4().hex[:10]}"
    n_layers, n_heads = len(maps.layers), len(maps.heads)
    layers = "".join(f"<option value='{i}'>layer {layer}</option>" for i, layer in enumerate(maps.layers))
    layers += f"<option value='{n_layers}' selected>mean over layers</option>"
    heads = "".join(f"<option value='{i}'>head {h}</option>" for i, h in enumerate(maps.heads))
    heads += f"<option value='{n_heads}' selected>mean over heads</option>"
    scales = "".join(f"<option{' selected' if s == 'sqrt' else ''}>{s}</option>" for s in ("linear", "sqrt", "log"))
    present = sorted({*maps.q_roles.tolist(), *maps.k_roles.tolist()})
    legend = " ".join(
        f"<span style='color:{palette[maps.role_names[i]]};font-weight:600'>■ {html.escape(maps.role_names[i])}</span>"
        for i in present
    )
    static = ""
    if fallback_png is not None:
        src = base64.b64encode(fallback_png).decode("ascii")
        static = f"<img alt='{html.escape(title)} (static)' src='data:image/png;base64,{src}' style='max-width:100%'>"
    payload = json.dumps(data).replace("</", "<\\/")  # no early </script>
    script = _JS.replace("ROOT", json.dumps(root)).replace("DATA", payload)
    return (
        f"<div id='{root}' style='font-family:sans-serif;font-size:12px'>"
        f"<div><b>{html.escape(title)}</b></div>"
        f"<div class='al-static'>{static}</div>"
        f"<div class='al-live' style='display:none'>"
        f"<div>queries on rows, keys on columns · <select class='al-layer'>{layers}</select> "
        f"<select class='al-head'>{heads}</select> scale <select class='al-scale'>{scales}</select> "
        f"· one colour scale for every layer and head (0 – {vmax:.3g})</div>"
        f"<div>{legend}</div><div style='display:flex;align-items:flex-start;gap:8px'><canvas></canvas>"
        f"<canvas class='al-cbar' width='70' height='260'></canvas></div>"
        f"<div class='al-tip' style='height:1.2em;color:#333'></div></div>"
        f"<script>{script}</script></div>"
    )
