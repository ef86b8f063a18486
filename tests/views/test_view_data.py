"""The view's data read back from its HTML equals the maps: full maps, means, thumbnails, the budget, the
alignment of two checkpoints and their difference (a − b on the shared tokens), masked cells and rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anchorlens.views import attention_view_html
from anchorlens.views.align import align, difference
from anchorlens.views.data import CODE_MAX, decode_full, decode_thumbs, empty_rows
from tests.views.synth import assert_decoded, causal_maps, embedded_data

FULL_ATOL = 1.0 / CODE_MAX  # the largest coding error of a probability (at vmax = 1)


def _full(data: dict, ci: int, key: str) -> np.ndarray:
    c = data["checkpoints"][ci]
    return decode_full(c["full"][key], (len(c["q"]), len(c["k"])), data["vmax"], c["causal"])


def test_full_maps_equal_the_probabilities_and_their_means():
    sm = causal_maps(9, layers=3, heads=2)
    data = embedded_data(attention_view_html({"ckpt": sm}))
    p = sm.probs.double().numpy()
    tri = np.tril(np.ones((9, 9), bool))
    want = {"all": p.mean(axis=(0, 1)), "L2": p[2].mean(axis=0), "H1": p[:, 1].mean(axis=0), "L1H0": p[1, 0]}
    assert data["vmax"] == pytest.approx(float(p.max()))
    for key, ref in want.items():
        got = _full(data, 0, key)
        assert np.isnan(got[~tri]).all(), key  # the causal upper triangle is not sent: n/a, not 0
        assert_decoded(got[tri], ref[tri], data["vmax"])
    assert set(data["checkpoints"][0]["full"]) == {"all", "L0", "L1", "L2", "H0", "H1"} | {
        f"L{i}H{j}" for i in range(3) for j in range(2)
    }
    tiny = _full(data, 0, "L0H0")[tri]
    assert (tiny[p[0, 0][tri] > 1e-8] > 0).all()  # small weights stay non-zero on the shared scale


def test_thumbnails_are_block_means_over_visible_cells():
    sm = causal_maps(100, layers=2, heads=2)
    c = embedded_data(attention_view_html(sm))["checkpoints"][0]
    data = embedded_data(attention_view_html(sm))
    tq, tk = c["tq"], c["tk"]
    assert (tq, tk) == (48, 48)
    thumbs = decode_thumbs(c["thumbs"], (3, 3, tq, tk), data["tvmax"])
    p = sm.probs.double().numpy()
    block = [i * 48 // 100 for i in range(100)]  # position -> block
    for (layer, head), ref in {
        (0, 1): p[0, 1],
        (1, 2): p[1].mean(0),
        (2, 0): p[:, 0].mean(0),
        (2, 2): p.mean((0, 1)),
    }.items():
        for bi, bj in [(0, 0), (10, 3), (47, 47), (20, 30)]:
            rows = [q for q in range(100) if block[q] == bi]
            cols = [k for k in range(100) if block[k] == bj]
            cells = [ref[q, k] for q in rows for k in cols if k <= q]
            got = thumbs[layer, head, bi, bj]
            if not cells:
                assert np.isnan(got)  # a block with no visible cell is masked, not 0
            else:
                # uint8 sqrt code: half a code step of sqrt(value / tvmax)
                tol = (np.sqrt(np.mean(cells) / data["tvmax"]) + 1 / 254) / 254 * data["tvmax"] + 1e-12
                assert got == pytest.approx(np.mean(cells), abs=tol), (layer, head, bi, bj)


def test_budget_sends_the_overall_mean_first_then_asked_layers():
    sm = causal_maps(40, layers=4, heads=3)
    small = embedded_data(attention_view_html(sm, max_bytes=1))["checkpoints"][0]["full"]
    assert set(small) == {"all"}
    one = len(embedded_data(attention_view_html(sm))["checkpoints"][0]["full"]["L0H0"])
    means = sum(
        len(v)
        for k, v in embedded_data(attention_view_html(sm))["checkpoints"][0]["full"].items()
        if k != "all" and (k.count("H") == 0 or k.startswith("H"))
    )
    asked = embedded_data(attention_view_html(sm, layers=[3], max_bytes=means + 4 * one))["checkpoints"][0]["full"]
    assert {f"L3H{j}" for j in range(3)} <= set(asked)  # the asked layer's heads come before any other layer's
    assert not any(f"L{i}H0" in asked for i in range(3))


def test_alignment_marks_inserted_positions_and_difference_is_a_minus_b():
    guided = causal_maps(8, inserted=(2, 3), seed=1)  # two <instance> positions before input tokens 2 and 3
    base = causal_maps(8, seed=2)
    data = embedded_data(attention_view_html({"guided": guided, "base": base}))
    pair = data["pairs"]["0,1"]
    inserted = [i for i, t in enumerate(guided.q_tokens) if t == "<instance>"]
    assert [a for a, b in zip(pair["qa"], pair["qb"]) if b < 0] == inserted  # no counterpart in the base
    matched = [(a, b) for a, b in zip(pair["qa"], pair["qb"]) if a >= 0 and b >= 0]
    assert [guided.q_tokens[a] for a, _ in matched] == base.q_tokens  # every base token, once, in order
    assert all(b >= 0 for a, b in zip(pair["qa"], pair["qb"]) if a < 0)
    # the difference on the aligned tokens: guided with its inserted rows/columns removed, minus base
    keep = [i for i in range(len(guided.q_tokens)) if i not in inserted]
    a = guided.probs.double().mean((0, 1)).numpy()[np.ix_(keep, keep)]
    b = base.probs.double().mean((0, 1)).numpy()
    rows = list(zip(pair["qa"], pair["qb"]))
    cols = list(zip(pair["ka"], pair["kb"]))
    diff = difference(_full(data, 0, "all"), _full(data, 1, "all"), rows, cols)
    on = [n for n, (x, y) in enumerate(rows) if x >= 0 and y >= 0]
    off = [n for n, (x, y) in enumerate(rows) if x < 0 or y < 0]
    got = diff[np.ix_(on, on)]
    tri = np.tril(np.ones_like(a, bool))
    np.testing.assert_allclose(got[tri], (a - b)[tri], atol=2 * FULL_ATOL, rtol=0)
    assert np.isnan(got[~tri]).all() and np.isnan(diff[off]).all() and np.isnan(diff[:, off]).all()


def test_align_never_matches_guidance_and_orders_merged_positions():
    merged = align(
        ["<s>", "<instance>", "a", "b"],
        ["special", "instance", "content", "content"],
        ["<s>", "a", "<instance>", "b"],
        ["special", "content", "instance", "content"],
    )
    assert merged == [(0, 0), (1, -1), (2, 1), (-1, 2), (3, 3)]


def test_fully_masked_rows_are_flagged_not_values():
    sm = causal_maps(6, empty_row=3)
    qk = sm.probs.double().mean((0, 1)).numpy()
    assert empty_rows(qk, causal=True).tolist() == [False, False, False, True, False, False]


def test_html_is_offline_and_ids_unique():
    sm = causal_maps(5)
    one, two = attention_view_html(sm, title="a"), attention_view_html(sm, title="a")
    for page in (one, two):
        assert "http" not in page and "<script src" not in page and "<link" not in page and "@import" not in page
        assert page.count("</script>") == 1
    ids = [p.split("id='", 1)[1].split("'", 1)[0] for p in (one, two)]
    assert ids[0] != ids[1] and ids[0] in one and ids[0] not in two


def test_token_text_cannot_break_out_of_the_script():
    sm = causal_maps(4)
    sm.q_tokens[1] = sm.k_tokens[1] = "</script><b>x"
    page = attention_view_html(sm)
    assert page.count("</script>") == 1
    assert embedded_data(page)["checkpoints"][0]["q"][1][0].startswith("</script>")


def test_float16_and_bfloat16_maps_are_accepted():
    sm = causal_maps(6)
    sm.probs = sm.probs.to(torch.bfloat16)
    data = embedded_data(attention_view_html(sm))
    np.testing.assert_allclose(
        np.nan_to_num(_full(data, 0, "all")), sm.probs.double().mean((0, 1)).numpy(), atol=FULL_ATOL
    )
