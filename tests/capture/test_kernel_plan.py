"""The kernel plan: statistics from the flash kernel's log-sum-exp equal the materialised plan's, and refusals are
one line naming the reducer or the reason and the site."""

from __future__ import annotations

import pytest
import torch

from anchorlens.analyses import default_reducers
from anchorlens.analyses.registry import make_reducer
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.run import capture_batch
from anchorlens.capture.sinks import StreamSink
from anchorlens.engine.call import AttentionCall
from anchorlens.engine.kernel import SMALL_SET_KEYS, KernelPlan, kernel_attention, kernel_available
from anchorlens.engine.plan import choose_plan
from anchorlens.errors import UsageError
from anchorlens.models.tiny import TINY_BASES
from tests.methods.helpers import rte_batch

pytestmark = pytest.mark.skipif(not kernel_available(), reason="this PyTorch lacks the CPU flash kernel")

# families whose attention the kernel cannot compute, and why (everything else runs the kernel plan)
REFUSED = {
    "tiny-t5": "position bias",
    "tiny-gemma2": "soft-caps",
    "tiny-gpt-oss": "learned sinks",
}


def _batch(base, padding_side: str):
    return rte_batch(base, padding_side, n=4)


def _frames_agree(a, b, tol: float) -> float:
    """The largest |difference| between the frames of two reducer lists; their rows must be the same."""
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        fa, fb = x.frame(), y.frame()
        assert len(fa) == len(fb) and (len(fa) > 0 or x.name == "learned_sink"), x.name
        if fa.empty:
            continue
        assert fa.drop(columns="value").equals(fb.drop(columns="value")), x.name
        diff = float((fa["value"] - fb["value"]).abs().max())
        assert diff <= tol, (x.name, diff)
        worst = max(worst, diff)
    return worst


@pytest.mark.parametrize("name", list(TINY_BASES))
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_default_reducers_agree_between_the_plans(tiny_base, name, padding_side):
    """Every family, both paddings: the default reducers' frames under the kernel plan equal the materialised plan's
    (itself equal to eager ``output_attentions``, test_exactness) within 1e-5; families whose attention the kernel
    cannot compute are refused in one line naming the reason and the site."""
    base = tiny_base(name)
    batch = _batch(base, padding_side)
    kernel, materialised = default_reducers(), default_reducers()
    if name in REFUSED:
        with pytest.raises(UsageError, match=rf"cannot compute \w+\.\d+ exactly: .*{REFUSED[name]}"):
            capture_batch(base, batch, StreamSink(kernel), need_logits=False, options=CaptureOptions(plan="kernel"))
        return
    capture_batch(base, batch, StreamSink(kernel), need_logits=False, options=CaptureOptions(plan="kernel"))
    capture_batch(base, batch, StreamSink(materialised), need_logits=False, options=CaptureOptions(plan="materialised"))
    _frames_agree(kernel, materialised, 1e-5)


def test_the_kernel_plans_logits_are_the_plain_forwards(tiny_base):
    """Fast mode takes the kernel's own output: the logits equal the materialised plan's and sdpa's to rounding."""
    base = tiny_base("tiny-llama")
    batch = _batch(base, "left")
    rows = batch.attention_mask.bool()
    kernel = capture_batch(base, batch, StreamSink(default_reducers()), options=CaptureOptions("fast", plan="kernel"))
    strict = capture_batch(base, batch, StreamSink(default_reducers()), options=CaptureOptions("strict", plan="kernel"))
    with torch.no_grad():
        plain = base.forward(batch).logits
    assert float((kernel.logits - plain).abs()[rows].max()) <= 1e-5
    torch.testing.assert_close(strict.logits[rows], plain[rows], rtol=0, atol=1e-6)


def test_selected_heads_and_sites_agree_between_the_plans(tiny_base):
    from anchorlens.capture.selection import Selection

    base = tiny_base("tiny-qwen2")
    batch = _batch(base, "left")
    selection = Selection(layers=(1,), heads=(1, 3))
    kernel, materialised = default_reducers(), default_reducers()
    for reducers, plan in ((kernel, "kernel"), (materialised, "materialised")):
        capture_batch(
            base, batch, StreamSink(reducers), selection, need_logits=False, options=CaptureOptions(plan=plan)
        )
    frame = kernel[0].frame()
    assert set(frame["head"]) == {1, 3} and set(frame["layer"]) == {1}
    _frames_agree(kernel, materialised, 1e-5)


def test_a_reducer_that_reads_the_maps_is_named_before_any_forward(tiny_base):
    base = tiny_base("tiny-llama")
    sink = StreamSink([*default_reducers(), make_reducer("first_token", anchor_position=2)])
    with pytest.raises(UsageError, match="^first_token reads probs, which the kernel plan does not compute"):
        capture_batch(base, _batch(base, "right"), sink, need_logits=False, options=CaptureOptions(plan="kernel"))


@pytest.mark.parametrize("name", [n for n in TINY_BASES if n not in REFUSED])
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_the_evidence_reducers_agree_between_the_plans(tiny_base, name, padding_side):
    """The mass each key receives, summed over the queries, comes from one transposed kernel pass under the kernel
    plan, and the value-weighted key sums from passes of per-head columns: the sink battery's frame (top keys, their
    received mass, sink rates) and value mass's (norm mass, share, total) equal the materialised plan's within 1e-5,
    beside the default reducers, also when the queries arrive in several chunks. A module whose output cannot be
    decomposed per head is refused in the same line under both plans."""
    base = tiny_base(name)
    batch = _batch(base, padding_side)

    def evidence():
        return default_reducers(extra={"sink_battery": {"eps": [0.1, 0.3], "top": 4}, "value_mass": {}})

    for budget in (512 * 2**20, 4096):  # 4 KiB: a few queries per chunk
        kernel, materialised = evidence(), evidence()
        errors = []
        for reducers, plan in ((kernel, "kernel"), (materialised, "materialised")):
            options = CaptureOptions(plan=plan, memory_budget=budget)
            sink = StreamSink(reducers)
            try:
                capture_batch(base, batch, sink, need_logits=False, options=options)
            except UsageError as err:
                errors.append(str(err))
                continue
            assert set(sink.plans.values()) == {plan}
        if errors:
            assert len(errors) == 2 and errors[0] == errors[1] and "value" in errors[0], errors
            return
        _frames_agree(kernel, materialised, 1e-5)


@pytest.mark.parametrize("small_set", [SMALL_SET_KEYS, 8])
def test_an_unpadded_input_gives_the_same_evidence_under_both_plans(tiny_base, monkeypatch, small_set):
    """A call without a mask (one unpadded input: key spans, the reversed causal pass) in several query chunks: the
    same top keys, received mass and value mass as the materialised plan; with a small-set limit of 8 keys the
    large key sets (content, every key) and their value-weighted sums take kernel passes."""
    from anchorlens.engine import kernel as kernel_module
    from anchorlens.tasks.bundled import bundled_examples
    from anchorlens.tasks.registry import get_task

    monkeypatch.setattr(kernel_module, "SMALL_SET_KEYS", small_set)
    base = tiny_base("tiny-llama")
    batch = base.encode([get_task("rte").template.render(bundled_examples("rte")[0])])
    assert int(batch.attention_mask.min()) == 1  # no mask reaches the attention

    def evidence():
        return default_reducers(extra={"sink_battery": {"top": 5}, "value_mass": {}})

    kernel, materialised = evidence(), evidence()
    for reducers, plan in ((kernel, "kernel"), (materialised, "materialised")):
        options = CaptureOptions(plan=plan, memory_budget=4096)
        capture_batch(base, batch, StreamSink(reducers), need_logits=False, options=options)
    assert _frames_agree(kernel, materialised, 1e-5) > 0.0  # compared values, not empty frames


def test_a_knockout_rules_the_kernel_plan_out_and_auto_materialises(tiny_base):
    from anchorlens.methods import load_guided

    base = tiny_base("tiny-llama")
    batch = _batch(base, "right")
    knocked = load_guided("knockout:keys=first,mode=renorm", base)
    with pytest.raises(UsageError, match=r"cannot compute decoder\.0 exactly: a knockout edits this call"):
        capture_batch(
            knocked, batch, StreamSink(default_reducers()), need_logits=False, options=CaptureOptions(plan="kernel")
        )
    auto, materialised = StreamSink(default_reducers()), StreamSink(default_reducers())
    capture_batch(knocked, batch, auto, need_logits=False, options=CaptureOptions(plan="auto"))
    capture_batch(knocked, batch, materialised, need_logits=False, options=CaptureOptions(plan="materialised"))
    assert set(auto.plans.values()) == {"materialised"}
    _frames_agree(auto.reducers, materialised.reducers, 0.0)


def test_auto_takes_the_kernel_plan_only_where_it_costs_at_most_the_measured_passes(tiny_base):
    """On a CPU the materialised plan's products run about as fast as the flash kernel: auto takes the kernel plan
    for statistics that need no pass beyond the output's (role flow, first token, decomposition), and materialises
    for the entropy's score sums (one more pass); the session records the plan of every site."""
    base = tiny_base("tiny-llama")
    batch = _batch(base, "right")
    light = StreamSink([make_reducer(n) for n in ("role_flow", "first_token", "decomposition")])
    full = StreamSink(default_reducers())
    for sink in (light, full):
        capture_batch(base, batch, sink, need_logits=False)
    assert set(light.plans.values()) == {"kernel"} and len(light.plans) == base.model.config.num_hidden_layers
    assert set(full.plans.values()) == {"materialised"} and len(full.plans) == len(light.plans)


def _eager(q, k, v, mask, scaling):
    """Reference per head: scores [B, H, Q, K] with -inf where hidden, probabilities, output."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = (q.double() @ k.double().transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)  # rows that see nothing: zero
    return scores, probs, probs @ v.double()


@pytest.mark.parametrize("causal", [True, False])
def test_kernel_sums_equal_eager_for_small_complement_and_pass_columns(causal):
    """Grouped heads, a padded example (with queries that see no key), key columns of every kind: a small set, the
    complement of a small set, dense columns that need a kernel pass (more than D of them: two passes), and score
    sums; all equal eager arithmetic in float64 within 1e-5."""
    g = torch.Generator().manual_seed(0)
    b, h, kv, t, d = 2, 4, 2, 600, 8
    q, k, v = (torch.randn(b, n, t, d, generator=g) for n in (h, kv, kv))
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[1, :40] = False  # left padding of the second example
    mask = valid[:, None, None, :].expand(b, 1, t, t).clone()
    if causal:
        mask &= torch.ones(t, t, dtype=torch.bool).tril()
    mask[1, :, :40] = False  # padding queries see nothing
    small = torch.zeros(b, t, 1)
    small[:, [0, 5, 77, 540]] = 1.0
    rest = valid.float()[..., None].clone()
    rest[:, 3:9] = 0.0  # all valid keys but a few
    dense = (torch.rand(b, t, 2 * d + 3, generator=g) < 0.5).float()  # 19 dense columns: 3 passes of up to 8
    weights = torch.rand(b, t, 1, generator=g)  # not 0/1: never a complement
    columns = torch.cat([small, rest, dense, weights], -1)
    scored = torch.cat([valid.float()[..., None], rest, dense[..., :1]], -1)
    call = AttentionCall(q, k, v, mask, 0.3, False, None, None, None, None)
    plan = KernelPlan.of(columns, scored, t, d)
    assert plan.split is not None and int(plan.split.small.numel()) <= SMALL_SET_KEYS
    # key columns: small, complement, 20 in passes; score columns: complement (of the padding), complement, a pass
    assert plan.split.passes.tolist() == [False, False] + [True] * 20 + [False, False, True]
    assert plan.split.is_complement.tolist() == [False, True] + [False] * 20 + [True, True, False]
    # the output pass, ceil(20 / 8) = 3 passes of probability columns, the score total, one weighted column
    assert plan.passes == 1 + 3 + 1 + 1
    result = kernel_attention(call, columns, scored, plan)
    scores, probs, out = _eager(q, k, v, mask, 0.3)
    sees = mask.any(-1)  # [B, 1, Q]
    want_sums = probs @ columns.double()[:, None]
    finite = torch.where(mask, scores, 0.0)
    want_scores = (probs * finite) @ scored.double()[:, None]
    assert float((result.key_sums - want_sums).abs().max()) <= 1e-5
    assert float((result.score_sums - want_scores).abs().max()) <= 1e-5
    lse = torch.logsumexp(scores, -1)
    assert float((result.lse.squeeze(-1) - lse).abs()[sees.expand_as(lse)].max()) <= 1e-5
    rows = sees.squeeze(1)[:, :, None, None]  # [B, Q, 1, 1]: the output of a query that sees nothing is sdpa's
    assert float(torch.where(rows, (result.output.double() - out.transpose(1, 2)).abs(), 0.0).max()) <= 1e-5


@pytest.mark.parametrize("causal", [True, False])
def test_value_weighted_sums_equal_eager(causal):
    """Key columns of every kind weighted per head by value norms (small sets key by key, complements and dense
    columns in passes of per-head columns) equal eager's P @ (n^h * C) in float64 within 1e-5, for every query
    chunk; the plan counts the passes."""
    from anchorlens.engine.call import trim_unseen_keys, visible_keys
    from anchorlens.engine.kernel import KernelCall

    g = torch.Generator().manual_seed(2)
    b, h, kv, t, d = 2, 4, 2, 400, 8
    q, k, v = (torch.randn(b, n, t, d, generator=g) for n in (h, kv, kv))
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[0, -25:] = False  # right padding of the first example
    mask = valid[:, None, None, :].expand(b, 1, t, t).clone()
    if causal:
        mask &= torch.ones(t, t, dtype=torch.bool).tril()
    small = torch.zeros(b, t, 2)
    small[:, [0, 3], 0] = 1.0
    small[:, 17, 1] = 1.0
    rest = valid.float()[..., None].clone()
    rest[:, 5:9] = 0.0
    dense = (torch.rand(b, t, d + 2, generator=g) < 0.5).float()  # 10 dense columns
    columns = torch.cat([small, rest, dense], -1)
    norms = torch.rand(b, h, t, generator=g) * 3
    call = AttentionCall(q, k, v, mask, 0.3, False, None, None, None, None)
    plan = KernelPlan.of(columns, None, t, d, value_sums=True)
    # the output, 2 passes of the 10 dense columns, then the complement and the dense columns weighted: 2 more
    assert plan.passes == 1 + 2 + 2
    whole = KernelCall(call, columns, None, plan)
    whole.weigh_values(norms)
    _, probs, _ = _eager(q, k, v, mask, 0.3)
    want = probs @ (columns.double()[:, None] * norms.double()[..., None])  # [B, H, Q, C]
    for start, stop in [(0, t), (0, 130), (130, 400)]:
        visible = trim_unseen_keys(visible_keys(call, start, stop))
        got = whole.chunk(start, stop, visible).value_sums
        assert got is not None
        assert float((got - want[:, :, start:stop]).abs().max()) <= 1e-5, (start, stop)


@pytest.mark.parametrize(("masked", "causal"), [(True, True), (True, False), (False, True), (False, False)])
def test_received_mass_equals_eager_column_sums(masked, causal):
    """The transposed pass: the mass each key receives from a chunk's weighted queries, sum_i w_i p_ij, equals eager
    arithmetic in float64 within 1e-5 relative to the chunk's weight (grouped heads; with a mask: a padded example
    whose padding queries see no key; without: the reversed causal pass, or every key), for every chunk of a call."""
    from anchorlens.engine.call import KeySpan, trim_unseen_keys, visible_keys
    from anchorlens.engine.kernel import KernelCall

    g = torch.Generator().manual_seed(1)
    b, h, kv, t, d = 2, 4, 2, 300, 8
    q, k, v = (torch.randn(b, n, t, d, generator=g) * 2 for n in (h, kv, kv))
    weights = torch.ones(b, t)
    mask = None
    if masked:
        weights[1, :30] = 0.0  # left padding of the second example: its queries weigh nothing and see nothing
        mask = weights.bool()[:, None, None, :].expand(b, 1, t, t).clone()
        if causal:
            mask &= torch.ones(t, t, dtype=torch.bool).tril()
        mask[1, :, :30] = False
    call = AttentionCall(q, k, v, mask, 0.3, causal and not masked, None, None, None, None)
    whole = KernelCall(call)
    full = mask if mask is not None else visible_keys(call, 0, t)[..., :t]
    _, probs, _ = _eager(q, k, v, full, 0.3)
    for start, stop in [(0, t), (0, 70), (70, 300), (299, 300)]:
        span = KeySpan.of(call, start, stop)
        visible = span if span is not None else trim_unseen_keys(visible_keys(call, start, stop))
        got = whole.received(start, stop, visible, weights[:, start:stop])
        want = (probs[:, :, start:stop] * weights[:, None, start:stop, None].double()).sum(2)
        k_len = got.shape[-1]
        assert float(want[..., k_len:].abs().sum()) == 0.0  # the keys after K' receive nothing
        scale = max(1.0, float(weights[:, start:stop].sum(1).max()))
        assert float((got - want[..., :k_len]).abs().max()) / scale <= 1e-5, (start, stop)


def test_choose_plan_names_the_reader_the_quantity_and_the_site():
    def readers(q: str) -> list[str]:
        return ["my_reducer"] if q == "probs" else []

    args = (readers, "decoder.3", lambda: None, lambda: 1, "cpu")
    assert choose_plan("materialised", frozenset({"key_sums"}), *args) == "materialised"
    assert choose_plan("auto", frozenset({"key_sums"}), *args) == "kernel"
    assert choose_plan("auto", frozenset({"probs"}), *args) == "materialised"
    assert choose_plan("auto", frozenset({"key_sums"}), readers, "decoder.3", lambda: None, lambda: 1, "cuda") == (
        "materialised"
    )
    # an entropy's one extra pass: materialised below 8,192 keys on a CPU, the kernel plan from there on
    assert choose_plan("auto", frozenset({"key_sums"}), readers, "decoder.3", lambda: None, lambda: 2, "cpu", 4096) == (
        "materialised"
    )
    # the evidence reducers' four passes: materialised at 8,192 keys, the kernel plan from 16,384 on
    assert choose_plan("auto", frozenset({"received"}), readers, "decoder.3", lambda: None, lambda: 4, "cpu", 8192) == (
        "materialised"
    )
    assert choose_plan(
        "auto", frozenset({"received"}), readers, "decoder.3", lambda: None, lambda: 4, "cpu", 16384
    ) == ("kernel")
    assert choose_plan("auto", frozenset({"probs"}), readers, "decoder.3", lambda: None, lambda: 1, "cpu", 16384) == (
        "materialised"  # the maps themselves: only materialised
    )
    assert choose_plan("auto", frozenset({"key_sums"}), readers, "decoder.3", lambda: None, lambda: 2, "cpu", 8192) == (
        "kernel"
    )
    assert choose_plan("auto", frozenset({"key_sums"}), readers, "decoder.3", lambda: None, lambda: 3, "cpu", 8192) == (
        "materialised"
    )
    with pytest.raises(UsageError, match="^my_reducer reads probs at decoder.3, which the kernel plan does not"):
        choose_plan("kernel", frozenset({"probs", "key_sums"}), *args)
    with pytest.raises(UsageError, match="cannot compute decoder.3 exactly: the module soft-caps"):
        choose_plan(
            "kernel", frozenset({"key_sums"}), readers, "decoder.3", lambda: "the module soft-caps", lambda: 1, "cpu"
        )
