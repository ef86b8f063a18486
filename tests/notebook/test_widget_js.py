"""The widget's inline script, run in node against a DOM stub: it draws every cell with the shared
scale's colours, masked cells hatched, starts on the layer and head mean, and hides the static image."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from anchorlens.capture.maps import StackMaps
from anchorlens.notebook.widget import _lut, widget_html

NODE = shutil.which("node")
RUNNER = Path(__file__).with_name("widget_stub.js")


def _maps() -> StackMaps:
    probs = torch.zeros(2, 2, 3, 3)
    probs[..., 0, 0] = 1.0
    probs[..., 1, :2] = torch.tensor([0.75, 0.25])
    probs[..., 2, :] = torch.tensor([0.5, 0.5 - 1e-6, 1e-6])
    probs[1, 1, 2] = torch.tensor([0.9, 0.1 - 1e-6, 1e-6])
    roles = torch.tensor([0, 1, 2])
    return StackMaps(probs, [0, 1], [0, 1], roles, roles.clone(), ["<s>", "a", "b"], ["<s>", "a", "b"])


def _run(tmp_path, layer: str, head: str, scale: str) -> dict:
    html = widget_html(_maps(), title="t", fallback_png=b"\x89PNG")
    root = re.search(r"<div id='(al-[0-9a-f]+)'", html).group(1)
    script = re.search(r"<script>(.*)</script>", html, re.S).group(1)
    (tmp_path / "w.js").write_text(script)
    out = subprocess.run(
        [NODE, str(RUNNER), str(tmp_path / "w.js"), root, layer, head, scale],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(NODE is None, reason="node not installed")
def test_script_draws_shared_scale_with_hatched_mask(tmp_path):
    lut = _lut()
    facts = _run(tmp_path, "2", "2", "linear")  # index 2 = the mean over layers / heads
    assert facts["static"] == "none" and facts["live"] == "block"
    cells = facts["fills"][:9]  # row-major 3 x 3 after the background fill
    assert [cells[i] for i in (1, 2, 5)] == ["HATCH"] * 3  # causal upper triangle
    mean = _maps().probs.double().mean(dim=(0, 1)).numpy()
    vmax = 1.0
    for q in range(3):
        for k in range(q + 1):
            want = lut[int(round(mean[q, k] / vmax * (len(lut) - 1)))]
            assert cells[q * 3 + k] == want, (q, k)
    assert cells[8] != "HATCH"  # a tiny (1e-6) value is a colour of the scale, not the mask
    assert "masked" in facts["cbar"]
    log = _run(tmp_path, "2", "2", "log")
    assert log["fills"][8] == lut[0]  # below the log floor: the lowest colour, still not hatched
    head = _run(tmp_path, "1", "1", "sqrt")["fills"][:9]
    assert head[6] == lut[int(round(np.sqrt(0.9) * (len(lut) - 1)))]
