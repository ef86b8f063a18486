"""inspect(): HF model + tokenizer and PEFT inputs, short text repr, static PNG in the bundle, shared-scale view."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest
import torch

from anchorlens.models.loading import load_base
from anchorlens.models.tiny import build_tiny
from anchorlens.notebook.inspect import inspect
from anchorlens.notebook.widget import AttentionView, attention_view, widget_html
from anchorlens.views.data import decode_full
from tests.views.synth import assert_decoded, embedded_data

TEXT = "The cat sat on the mat. It was warm."


@pytest.fixture(scope="module")
def base_view():
    return inspect(load_base("tiny-llama"), TEXT)


def test_hf_model_and_tokenizer_give_the_same_maps(base_view):
    model, tok = build_tiny("tiny-llama")  # what an HF user holds: a transformers model and its tokenizer
    view = inspect(model, TEXT, tokenizer=tok)
    ours, theirs = base_view.maps["decoder"], view.maps["decoder"]
    assert ours.k_tokens == theirs.k_tokens
    torch.testing.assert_close(theirs.probs, ours.probs, atol=1e-5, rtol=0)
    with pytest.raises(Exception, match="tokenizer"):
        inspect(model, TEXT)


def test_peft_prompt_tuning_model_is_accepted():
    peft = pytest.importorskip("peft")
    model, tok = build_tiny("tiny-llama")
    pm = peft.get_peft_model(model, peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3))
    view = inspect(pm, TEXT, tokenizer=tok)
    roles = view.maps["decoder"].k_roles.tolist()
    assert roles.count(3) == 3  # three soft-prompt positions (Role.SOFT_PROMPT)
    assert "PEFT" in view.checkpoint
    # the soft prompt inserted is PEFT's own prompt embedding
    torch.testing.assert_close(
        view.model.guidances[0].prompt.detach().float(),
        pm.get_prompt_embedding_to_save("default").float(),
        atol=0,
        rtol=0,
    )


def test_text_repr_is_a_short_summary(base_view):
    text = repr(base_view)
    assert len(text) < 600 and "tensor(" not in text
    assert text.startswith("Inspection of tiny-llama")
    sm = base_view.maps["decoder"]
    assert f"{len(sm.layers)} layers x {len(sm.heads)} heads" in text
    # the top anchor is the key receiving the most attention (mean over layers, heads, visible queries)
    qk = sm.probs.double().mean(dim=(0, 1)).numpy()
    n = qk.shape[0]
    received = [qk[k:, k].mean() for k in range(n)]
    best = int(np.argmax(received))
    pos, _, value = base_view.top_anchors(1)[0]
    assert pos == best and value == pytest.approx(received[best], rel=1e-5)


def test_bundle_has_static_png_and_html_with_fallback(base_view):
    bundle = base_view._repr_mimebundle_()
    assert set(bundle) == {"text/html", "image/png", "text/plain"}
    assert bundle["image/png"].startswith(b"\x89PNG")
    html = bundle["text/html"]
    img = re.search(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    assert img and base64.b64decode(img.group(1)) == bundle["image/png"]
    assert "tiny-llama" in html  # checkpoint named in the title
    assert "<option selected>sqrt</option>" in html and "<option>log</option>" in html
    assert "alv-thumbs" in html and "alv-text" in html  # the interactive view, shown where scripts run


def test_widget_one_shared_scale_and_masked_flag(base_view):
    sm = base_view.maps["decoder"]
    data = embedded_data(widget_html(sm))
    (c,) = data["checkpoints"]
    assert c["causal"] is True and data["vmax"] == pytest.approx(float(sm.probs.max()))
    n = len(sm.q_tokens)
    tri = np.tril(np.ones((n, n), bool))
    shown = decode_full(c["full"]["all"], (n, n), data["vmax"], True)  # the view opens on the mean over all
    assert np.isnan(shown[~tri]).all()  # masked cells are not values
    assert_decoded(shown[tri], sm.probs.double().mean(dim=(0, 1)).numpy()[tri], data["vmax"])
    for i in range(len(sm.layers)):  # every head of every layer, on the same scale
        assert_decoded(
            decode_full(c["full"][f"L{i}H0"], (n, n), data["vmax"], True)[tri],
            sm.probs[i, 0].double().numpy()[tri],
            data["vmax"],
        )
    html = widget_html(sm)
    assert "<script src" not in html and "http" not in html


def test_view_of_two_checkpoints_has_png_fallback_and_diff_data(base_view):
    maps = {"a": base_view.maps, "b": base_view.maps}
    shown = attention_view(maps, title="two")
    assert isinstance(shown, AttentionView)
    bundle = shown._repr_mimebundle_()
    assert bundle["image/png"].startswith(b"\x89PNG") and "data:image/png;base64," in bundle["text/html"]
    data = embedded_data(bundle["text/html"])
    assert [c["name"] for c in data["checkpoints"]] == ["a", "b"]
    pair = data["pairs"]["0,1"]
    n = len(base_view.maps["decoder"].q_tokens)
    assert pair["qa"] == pair["qb"] == list(range(n))  # the same tokens: every position has its counterpart
    assert "two" in bundle["text/plain"] or "a, b" in bundle["text/plain"]


def test_inspect_certifies_its_input_and_shows_it():
    view = inspect("instance", {"premise": "A cat sat.", "hypothesis": "A cat sits."}, task="rte", base="tiny-qwen2")
    assert view.certificate is not None and view.certificate.exact
    assert view.certificate.examples == 1 and len(view.certificate.per_layer) == 4
    assert "exactness: max |Δ|" in view.summary() and "vs eager over 4 layers" in view.summary()
