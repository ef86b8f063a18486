"""Capture works on every method: layouts match the attention shapes and rows sum to 1 over valid keys."""

from __future__ import annotations

import pytest
import torch

from anchorlens.analyses import default_reducers
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.run import capture_batch
from anchorlens.capture.sinks import MapSink, StreamSink
from anchorlens.methods import Capsule, GuidedModel, InstanceToken, Prefix, load_guided
from anchorlens.roles.kinds import Role

from .helpers import Collect, rte_batch

SPECS = [
    "base",
    "instance",
    "instance:k=2,mode=chunks,pos=middle",
    "capsule",
    "capsule:fusion=prepend,pos=last",
    "capsule:fusion=project,pos=after_structural",
    "capsule:n=2,pos=middle",
    "capsule:n=2,fusion=prepend,pos=last",
    "prompt:n=3",
    "deep-prompt:n=2,pos=2",
    "prompt:n=2+instance+capsule+deep-prompt:n=1",
]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gpt2", "tiny-t5"])
@pytest.mark.parametrize("spec", SPECS)
def test_capture_every_method(tiny_base, name, spec):
    base = tiny_base(name)
    guided = load_guided(spec, base=base)
    batch = rte_batch(base, "left" if name != "tiny-t5" else "right")
    sink = Collect()
    out = capture_batch(guided, batch, sink)  # the session raises if a layout disagrees with a shape
    assert not torch.isnan(out.logits).any()
    assert {(e.stack, e.layer) for e in sink.events} == {(s.stack, s.layer) for s, _ in base.sites()}
    for event in sink.events:
        valid_q = event.layout.q.valid
        sums = event.probs.sum(-1)
        assert torch.allclose(sums[valid_q[:, None, :].expand_as(sums)], torch.ones(()), atol=1e-5)
        hidden = ~(event.visible & event.layout.k.valid[:, None, None, :])
        assert float((event.probs * hidden).abs().max()) == 0.0
    if not base.is_encoder_decoder:
        assert out.logits.shape[:2] == batch.input_ids.shape


@pytest.mark.parametrize(
    "spec,role,count",
    [
        ("capsule", Role.CAPSULE, 1),
        ("capsule:n=2", Role.CAPSULE, 2),
        ("capsule:n=2,fusion=prepend", Role.CAPSULE, 3),
        ("deep-prompt:n=3", Role.SOFT_PROMPT, 3),
        ("instance:k=2", Role.INSTANCE, 2),
    ],
)
def test_map_sink_labels_inserted_positions(tiny_base, spec, role, count):
    base = tiny_base("tiny-llama")
    guided = load_guided(spec, base=base)
    batch = rte_batch(base, "right")
    sink = MapSink()
    capture_batch(guided, batch, sink)
    maps = sink.maps(base.adapter.stack_sequences)
    for row, m in enumerate(maps):
        s = m.stacks["decoder"]
        q = int(batch.attention_mask[row].sum()) + count
        assert s.probs.shape == (base.num_layers, base.num_heads, q, q)
        assert s.q_roles[:count].tolist() == [int(role)] * count  # inserted first
        assert s.q_tokens[0] == f"<{role.label}>"


def test_capsule_gets_attention_from_later_tokens(tiny_base):
    base = tiny_base("tiny-llama")
    guided = load_guided("capsule", base=base)
    batch = rte_batch(base, "left")
    sink = Collect()
    capture_batch(guided, batch, sink)
    for event in sink.events:
        is_capsule = event.layout.k.roles == int(Role.CAPSULE)  # [B, K]
        mass = (event.probs * is_capsule[:, None, None, :]).sum(-1)  # [B, H, Q]
        assert float(mass.max()) > 0


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gpt2"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_prefix_composes_with_spliced_positions(tiny_base, name, padding_side):
    base = tiny_base(name)
    guided = GuidedModel(base, [Prefix(3), InstanceToken(), Capsule(position="middle")], seed=2)
    batch = rte_batch(base, padding_side)
    sink = Collect()
    out = capture_batch(guided, batch, sink)
    assert out.logits.shape[:2] == batch.input_ids.shape and not torch.isnan(out.logits).any()
    for event in sink.events:
        q, k = event.probs.shape[-2:]
        assert k == q + 3
        assert (event.layout.k.roles[:, :3] == int(Role.SOFT_PROMPT)).all()
        valid_q = event.layout.q.valid
        sums = event.probs.sum(-1)
        assert torch.allclose(sums[valid_q[:, None, :].expand_as(sums)], torch.ones(()), atol=1e-5)
        # every valid query sees every prefix key
        prefix_visible = event.visible[:, 0, :, :3].expand(valid_q.shape[0], q, 3)  # [B, Q, 3]
        assert bool(prefix_visible[valid_q].all())


class _Spy(StreamSink):
    """StreamSink that also records whether each event came with the capture's fused key-column sums."""

    def __init__(self, reducers) -> None:
        super().__init__(reducers)
        self.fused: list[bool] = []

    def consume(self, event) -> None:
        self.fused.append(event.key_sums is not None)
        super().consume(event)


GUIDED = ["capsule:n=2,pos=middle", "prompt:n=2+instance+capsule+deep-prompt:n=1"]


@pytest.mark.parametrize(
    "name, spec",
    [(n, s) for n in ("tiny-llama", "tiny-qwen2", "tiny-t5") for s in GUIDED]
    + [("tiny-llama", "prefix"), ("tiny-qwen2", "prefix")],  # prefixes are refused on T5
)
def test_guided_models_give_the_same_statistics_with_fused_and_separate_key_sums(tiny_base, name, spec):
    """Inserted positions and prefix keys (keys the input lacks) are columns like any other: fast mode's fused
    key-column sums give the frames strict mode's separate sums give."""
    base = tiny_base(name)
    if spec == "prefix":
        guided = GuidedModel(base, [Prefix(3), InstanceToken(), Capsule(position="middle")], seed=2)
    else:
        guided = load_guided(spec, base=base)
    batch = rte_batch(base, "left" if name != "tiny-t5" else "right")
    fast, strict = _Spy(default_reducers()), _Spy(default_reducers())
    capture_batch(guided, batch, fast, need_logits=False, options=CaptureOptions(mode="fast"))
    capture_batch(guided, batch, strict, need_logits=False, options=CaptureOptions(mode="strict"))
    assert fast.fused and all(fast.fused) and not any(strict.fused)
    for a, b in zip(fast.reducers, strict.reducers, strict=True):
        fa, fb = a.frame(), b.frame()
        assert len(fa) == len(fb) and (len(fa) > 0 or a.name == "learned_sink"), a.name  # no sinks here
        if fa.empty:
            continue
        assert float((fa["value"] - fb["value"]).abs().max()) <= 2e-6, a.name


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize(
    "spec", ["instance", "capsule", "capsule:n=2,fusion=prepend,pos=last", "deep-prompt:n=2,pos=2", "prompt:n=3"]
)
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_the_kernel_plan_equals_the_materialised_plan_under_guidance(tiny_base, name, spec, padding_side):
    """With guidance inserted (instance tokens, capsules fused or prepended, deep prompts replaced per layer), the
    default reducers' frames under the kernel plan equal the materialised plan's within 1e-5, and every site took
    the plan it was asked for."""
    base = tiny_base(name)
    guided = load_guided(spec, base=base)
    batch = rte_batch(base, padding_side)
    frames = {}
    for plan in ("kernel", "materialised"):
        anchor = guided.entropy_anchor() or "capsule"
        sink = StreamSink(default_reducers(anchor))
        capture_batch(guided, batch, sink, need_logits=False, options=CaptureOptions(plan=plan))
        sink.close()
        assert set(sink.plans.values()) == {plan}
        frames[plan] = [r.frame() for r in sink.reducers]
    for a, b in zip(frames["kernel"], frames["materialised"], strict=True):
        assert len(a) == len(b)
        if a.empty:
            continue
        assert a.drop(columns="value").equals(b.drop(columns="value"))
        assert float((a["value"] - b["value"]).abs().max()) <= 1e-5
