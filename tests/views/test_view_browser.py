"""The attention view as a user sees it, in headless Chromium with the network cut: no console error, no
request leaves the page, the drawn colours are the maps' values on the named scale, hovering a token changes what
is highlighted, clicking a thumbnail changes the map, the difference view is a − b on the shared tokens, and a
screenshot is not blank. Skips where no Chromium is installed."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from anchorlens.views import view_fragment
from anchorlens.views.data import CODE_MAX
from tests.views.browser import Browser, chromium_or_skip
from tests.views.synth import assert_decoded, causal_maps

ATOL = 1.0 / CODE_MAX + 1e-6  # the largest coding error of a probability, then float32 in the browser


@pytest.fixture(scope="module")
def browser():
    chromium_or_skip()
    with Browser() as b:
        yield b


def _open(browser: Browser, tmp_path, *fragments) -> None:
    page = tmp_path / "view.html"
    body = "".join(f.html for f in fragments)
    page.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>view</title></head><body>{body}</body></html>"
    )
    browser.errors.clear()
    browser.requests.clear()
    browser.open(page)
    for f in fragments:
        browser.eval(f"window.anchorlensViews[{json.dumps(f.root)}].ready()")


def _api(f, call: str):
    return f"window.anchorlensViews[{json.dumps(f.root)}].{call}"


def _grid(browser: Browser, f) -> tuple[np.ndarray, np.ndarray]:
    g = browser.eval(_api(f, "ready().then(() => window.anchorlensViews[" + json.dumps(f.root) + "].grid())"))
    v = np.array([np.nan if x is None else x for x in g["v"]], dtype=float).reshape(g["nr"], g["nc"])
    return v, np.array(g["kind"]).reshape(g["nr"], g["nc"])


def _canvas(browser: Browser, f, cls: str) -> str:
    return browser.eval(f"document.querySelector('#{f.root} .{cls}').toDataURL()")


def _clean(browser: Browser) -> None:
    assert browser.errors == [], browser.errors
    assert browser.outside_requests == [], browser.outside_requests


def test_opens_on_the_overall_mean_with_masks_hatched(browser, tmp_path):
    sm = causal_maps(10, layers=2, heads=3, empty_row=4)
    f = view_fragment(sm, title="one checkpoint", fallback_png=b"\x89PNG fallback")
    _open(browser, tmp_path, f)
    _clean(browser)
    assert browser.eval(f"getComputedStyle(document.querySelector('#{f.root} .alv-static')).display") == "none"
    v, kind = _grid(browser, f)
    ref = sm.probs.double().mean((0, 1)).numpy()
    tri = np.tril(np.ones((10, 10), bool))
    assert (kind[~tri & (np.arange(10)[:, None] != 4)] == 1).all()  # causal upper triangle: n/a (masked)
    assert (kind[4] == 3).all()  # the fully masked row: n/a, not a row of zeros
    ok = kind == 0
    assert ok.sum() == tri.sum() - 5
    assert_decoded(v[ok], ref[ok], f.data["vmax"], float32=True)
    # the pixels: a cell's centre is its value's colour on the sqrt scale; a masked cell is grey hatching
    lut = f.data["lut"]
    pixels = browser.eval(
        f"(() => {{const cv = document.querySelector('#{f.root} .alv-map'), g = cv.getContext('2d');"
        " return {w: cv.width, h: cv.height, data: Array.from(g.getImageData(0, 0, cv.width, cv.height).data)};})()"
    )
    img = np.array(pixels["data"], dtype=np.uint8).reshape(pixels["h"], pixels["w"], 4)
    cell = 16  # 10 tokens: the largest cell size
    right, bottom = pixels["w"] - 4, pixels["h"] - 4  # the grid ends 4 px before the canvas edge
    x0, y0 = right - 10 * cell, bottom - 10 * cell

    def colour(q: int, k: int) -> str:
        r, g, b, _ = img[y0 + q * cell + 5, x0 + k * cell + 8]
        return f"#{r:02x}{g:02x}{b:02x}"

    vmax = f.data["vmax"]
    for q, k in [(0, 0), (5, 0), (9, 3), (9, 9), (7, 6)]:
        at = round(min(1.0, np.sqrt(ref[q, k] / vmax)) * (len(lut) - 1))
        near = {lut[i] for i in range(max(0, at - 1), min(len(lut), at + 2))}  # one LUT step of quantisation
        assert colour(q, k) in near, (q, k, colour(q, k), lut[at])
    assert colour(2, 7) in ("#e4e4e4", "#a8a8a8") and colour(4, 1) in ("#e4e4e4", "#a8a8a8")
    names = browser.eval(f"document.querySelector('#{f.root} .alv-cbname').textContent")
    assert "attention probability" in names and "sqrt" in names


def test_hovering_a_token_changes_the_highlight(browser, tmp_path):
    sm = causal_maps(12, layers=2, heads=2)
    f = view_fragment(sm)
    _open(browser, tmp_path, f)
    before = (_canvas(browser, f, "alv-over"), browser.eval(_api(f, "text()")))
    browser.hover(*browser.center(f"#{f.root} .alv-tok[data-i='6']"))
    state = browser.eval(_api(f, "state()"))
    assert state["focus"] == {"r": 6, "c": 6}
    after = (_canvas(browser, f, "alv-over"), browser.eval(_api(f, "text()")))
    assert after[0] != before[0]  # the overlay now frames row 6 and column 6
    ref = sm.probs.double().mean((0, 1)).numpy()
    text = np.array([np.nan if x is None else x for x in after[1]])
    np.testing.assert_allclose(text[:7], ref[6, :7], atol=ATOL)  # the text: attention from token 6 (as a query)
    assert np.isnan(text[7:]).all()  # keys it cannot see: n/a
    colours = browser.eval(f"Array.from(document.querySelectorAll('#{f.root} .alv-tok'), s => s.style.background)")
    assert all("gradient" in c for c in colours[7:]) and not any("gradient" in c for c in colours[:7])
    # attention into token 3 (as a key)
    browser.eval(
        f"(() => {{const s = document.querySelector('#{f.root} .alv-dir'); s.value = 'to'; s.onchange({{target: s}});}})()"
    )
    browser.eval(_api(f, "ready()"))
    browser.hover(*browser.center(f"#{f.root} .alv-tok[data-i='3']"))
    text = np.array([np.nan if x is None else x for x in browser.eval(_api(f, "text()"))])
    np.testing.assert_allclose(text[3:], ref[3:, 3], atol=ATOL)
    assert np.isnan(text[:3]).all()
    # hovering the map's row labels focuses that token too
    rect = browser.rect(f"#{f.root} .alv-over")
    browser.hover(rect["x"] + 10, rect["y"] + rect["height"] - 4 - 16 * 2 + 8)  # the label of row 10
    assert browser.eval(_api(f, "state()"))["focus"] == {"r": 10, "c": 10}
    _clean(browser)


def test_role_focus_colours_text_by_role_attention(browser, tmp_path):
    sm = causal_maps(12, layers=1, heads=2)
    f = view_fragment(sm)
    _open(browser, tmp_path, f)
    structural = f.data["roles"].index("structural")
    browser.eval(
        f"(() => {{const s = document.querySelector('#{f.root} .alv-role'); s.value = '{structural}';"
        " s.onchange({target: s});})()"
    )
    text = np.array([np.nan if x is None else x for x in browser.eval(_api(f, "text()"))])
    ref = sm.probs.double().mean((0, 1)).numpy()
    rows = [i for i, r in enumerate(sm.q_roles.tolist()) if r == 1]  # structural queries: 4 and 8
    for k in range(12):
        seen = [q for q in rows if q >= k]
        if seen:
            assert text[k] == pytest.approx(ref[seen, k].mean(), abs=ATOL)
        else:
            assert np.isnan(text[k])
    assert "structural queries" in browser.eval(f"document.querySelector('#{f.root} .alv-tname').textContent")
    _clean(browser)


def test_thumbnail_click_shows_the_head_and_shift_click_combines(browser, tmp_path):
    sm = causal_maps(9, layers=3, heads=2)
    f = view_fragment(sm)
    _open(browser, tmp_path, f)
    p = sm.probs.double().numpy()
    before = _canvas(browser, f, "alv-map")
    browser.click(*browser.center(f"#{f.root} canvas.alv-th[data-l='1'][data-h='0']"))
    v, kind = _grid(browser, f)
    assert _canvas(browser, f, "alv-map") != before
    assert browser.eval(_api(f, "state()"))["sel"] == ["1:0"]
    assert_decoded(v[kind == 0], p[1, 0][kind == 0], f.data["vmax"], float32=True)
    browser.click(*browser.center(f"#{f.root} canvas.alv-th[data-l='2'][data-h='1']"), shift=True)
    v, kind = _grid(browser, f)
    assert browser.eval(_api(f, "state()"))["sel"] == ["1:0", "2:1"]
    np.testing.assert_allclose(v[kind == 0], ((p[1, 0] + p[2, 1]) / 2)[kind == 0], atol=ATOL)
    assert "mean of 2 heads" in browser.eval(f"document.querySelector('#{f.root} .alv-what').textContent")
    browser.click(*browser.center(f"#{f.root} canvas.alv-th[data-l='3'][data-h='1']"))  # head 1, mean over layers
    v, kind = _grid(browser, f)
    assert_decoded(v[kind == 0], p[:, 1].mean(0)[kind == 0], f.data["vmax"], float32=True)
    browser.click(*browser.center(f"#{f.root} .alv-all"))
    v, kind = _grid(browser, f)
    assert_decoded(v[kind == 0], p.mean((0, 1))[kind == 0], f.data["vmax"], float32=True)
    _clean(browser)


def test_heads_not_sent_at_full_resolution_show_block_means_and_say_so(browser, tmp_path):
    sm = causal_maps(60, layers=2, heads=2)
    f = view_fragment(sm, max_bytes=1)  # only the overall mean at full resolution
    _open(browser, tmp_path, f)
    browser.click(*browser.center(f"#{f.root} canvas.alv-th[data-l='0'][data-h='1']"))
    v, kind = _grid(browser, f)
    what = browser.eval(f"document.querySelector('#{f.root} .alv-what').textContent")
    assert "block means" in what and "not sent at full resolution" in what
    assert (kind[np.triu(np.ones((60, 60), bool), 1)] == 1).all()  # the mask stays exact
    block = [i * 48 // 60 for i in range(60)]
    ref = sm.probs.double().numpy()[0, 1]
    q, k = 30, 10
    cells = [
        ref[a, b] for a in range(60) for b in range(60) if block[a] == block[q] and block[b] == block[k] and b <= a
    ]
    assert v[q, k] == pytest.approx(np.mean(cells), rel=0.03, abs=1e-5)
    _clean(browser)


def test_difference_view_is_a_minus_b_on_shared_tokens(browser, tmp_path):
    guided = causal_maps(8, layers=2, heads=2, inserted=(3,), seed=1)
    base = causal_maps(8, layers=2, heads=2, seed=2)
    f = view_fragment({"guided": guided, "base": base})
    _open(browser, tmp_path, f)
    browser.eval(
        f"(() => {{const m = document.querySelector('#{f.root} .alv-mode'); m.value = 'diff'; m.onchange();}})()"
    )
    v, kind = _grid(browser, f)
    ins = guided.q_tokens.index("<instance>")
    assert v.shape == (9, 9)  # the base has no position the guided input lacks
    assert (kind[ins] == 2).all() and (kind[:, ins] == 2).all()  # no counterpart: its own pattern, no value
    keep = [i for i in range(9) if i != ins]
    want = guided.probs.double().mean((0, 1)).numpy()[np.ix_(keep, keep)] - base.probs.double().mean((0, 1)).numpy()
    got = v[np.ix_(keep, keep)]
    tri = np.tril(np.ones((8, 8), bool))
    np.testing.assert_allclose(got[tri], want[tri], atol=2 * ATOL)
    assert (kind[np.ix_(keep, keep)][~tri] == 1).all()
    name = browser.eval(f"document.querySelector('#{f.root} .alv-cbname').textContent")
    assert "Δ attention probability" in name and "guided − base" in name and "symmetric" in name
    assert browser.eval(f"Array.from(document.querySelectorAll('#{f.root} .alv-tok'), s => s.style.background)")[
        ins
    ].startswith("radial-gradient")
    _clean(browser)


def test_two_views_on_one_page_and_a_screenshot_that_is_not_blank(browser, tmp_path):
    from PIL import Image

    a, b = view_fragment(causal_maps(7), title="first"), view_fragment(causal_maps(5, seed=3), title="second")
    _open(browser, tmp_path, a, b)
    browser.click(*browser.center(f"#{b.root} canvas.alv-th[data-l='0'][data-h='0']"))
    assert browser.eval(_api(a, "state()"))["sel"] != ["0:0"] and browser.eval(_api(b, "state()"))["sel"] == ["0:0"]
    browser.eval("window.scrollTo(0, 0)")
    shot = np.asarray(Image.open(io.BytesIO(browser.screenshot())).convert("RGB"))
    colours = {tuple(c) for c in shot.reshape(-1, 3)[::7]}
    assert len(colours) > 50  # maps, thumbnails, text: far more than a blank or single-colour page
    _clean(browser)


@pytest.mark.slow
def test_a_thousand_tokens_stay_usable(browser, tmp_path):
    sm = causal_maps(1000, layers=2, heads=2)
    f = view_fragment(sm)
    _open(browser, tmp_path, f)
    v, kind = _grid(browser, f)
    assert v.shape == (1000, 1000) and (kind[np.triu(np.ones((1000, 1000), bool), 1)] == 1).all()
    np.testing.assert_allclose(v[999, :5], sm.probs.double().mean((0, 1)).numpy()[999, :5], atol=ATOL)
    assert browser.eval(f"document.querySelectorAll('#{f.root} *').length") < 1000 + 200  # one element per token
    browser.hover(*browser.center(f"#{f.root} .alv-tok[data-i='500']"))
    assert browser.eval(_api(f, "state()"))["focus"] == {"r": 500, "c": 500}
    _clean(browser)
