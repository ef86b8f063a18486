"""Families: every verified tiny base is discovered with the mechanisms its row lists, the tiny configs exercise
those mechanisms, deep prompts and prefixes are exact on each, and what discovery cannot serve is refused."""

from __future__ import annotations

import hashlib

import pytest
import torch

from anchorlens.errors import UsageError
from anchorlens.methods.spec import load_guided
from anchorlens.models.tiny import TINY_BASES, build_tiny, tiny_spec
from anchorlens.models.tiny_tokenizers import tiny_tokenizer
from anchorlens.models.verified import VERIFIED, verified_bases
from tests.methods.helpers import drop_rows, first_valid, insert_rows, rte_batch, run_block

DECODERS = verified_bases(kind="decoder")
PREFIX = verified_bases(kind="decoder", prefix=True)


def test_every_tiny_base_is_a_verified_row():
    assert sorted(v.tiny for v in VERIFIED) == sorted(TINY_BASES)
    assert len({v.model_type for v in VERIFIED}) == len(VERIFIED)


@pytest.mark.parametrize("row", VERIFIED, ids=[v.tiny for v in VERIFIED])
def test_discovery_reports_the_rows_mechanisms(tiny_base, row):
    """The table ``anchorlens models`` prints is what discovery finds on the tiny base, never a claim beside it."""
    base = tiny_base(row.tiny)
    found = base.adapter.found
    assert found.model_type == row.model_type
    assert found.mechanisms == row.mechanisms
    stack = "decoder" if row.kind != "encoder" else "encoder"
    assert tuple(found.other_layers(stack)) == row.other_layers
    assert base.adapter.supports_guidance == (row.guidance != "capture only")
    assert base.adapter.supports_prefix == row.prefix


# The five original tiny bases are used by every other test: their weights must never change.
PINNED = {
    "tiny-llama": "208b3e0706cd5d1196e18fc88a9c7250c3b941c4",
    "tiny-qwen2": "0b7e5eb9b40f4dfc0af54b277548bdaa3e35ad39",
    "tiny-gpt2": "ff3eab8b949e698601b3632fdfc97880e8506d00",
    "tiny-bert": "8e5e352868cef3e44a70cd6648f8c6e91176aac4",
    "tiny-t5": "ab75920883ba98dbdfe82b3779413d58e1255a22",
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_original_tiny_bases_keep_their_weights(name):
    model, _ = build_tiny(name)
    digest = hashlib.sha1(b"".join(p.detach().numpy().tobytes() for p in model.state_dict().values())).hexdigest()
    assert digest == PINNED[name]


def _eager_attentions(name: str, batch, **overrides) -> tuple[torch.Tensor, ...]:
    """Eager attentions of the tiny base ``name`` (same seed, same weights) with config ``overrides``."""
    model, _ = build_tiny(name, "eager", overrides=overrides)
    with torch.no_grad():
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True).attentions


MECHANISMS = [  # (base, what the tiny config sets, the setting that switches it off)
    ("tiny-mistral", "sliding window", {"sliding_window": None}),
    ("tiny-phi3", "sliding window", {"sliding_window": None}),
    ("tiny-gemma2", "sliding window", {"sliding_window": 4096}),
    ("tiny-gemma3", "sliding window", {"sliding_window": 4096}),
    ("tiny-gemma2", "attention soft-capping", {"attn_logit_softcapping": None}),
    ("tiny-gemma2", "query_pre_attn_scalar", {"query_pre_attn_scalar": 16}),
    ("tiny-gemma3", "query_pre_attn_scalar", {"query_pre_attn_scalar": 16}),
    (
        "tiny-gemma3",
        "local rotary",
        {
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
            }
        },
    ),
    (
        "tiny-gpt-neox",
        "partial rotary",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}},
    ),
    ("tiny-mixtral", "sliding window", {"sliding_window": None}),
    ("tiny-olmo3", "sliding window", {"sliding_window": 4096}),
    ("tiny-starcoder2", "sliding window", {"sliding_window": None}),
    ("tiny-cohere2", "sliding window", {"sliding_window": 4096}),
    ("tiny-gpt-oss", "sliding window", {"sliding_window": 4096}),
    ("tiny-smollm3", "NoPE layers", {"no_rope_layers": [1, 1, 1, 1]}),
    ("tiny-llama4-text", "chunked attention", {"attention_chunk_size": 4096}),
    ("tiny-llama4-text", "temperature tuning", {"attn_temperature_tuning": False}),
    (
        "tiny-phi",
        "partial rotary",
        {"rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 1.0, "rope_type": "default"}},
    ),
    ("tiny-granite", "attention multiplier", {"attention_multiplier": 0.25}),
    ("tiny-olmo", "qkv clipping", {"clip_qkv": None}),
]


@pytest.mark.parametrize("name,mechanism,off", MECHANISMS, ids=[f"{n}-{m}" for n, m, _ in MECHANISMS])
def test_tiny_configs_exercise_the_family_mechanism(tiny_base, name, mechanism, off):
    """Without this, exactness on the tiny bases could hold while the mechanism is mirrored wrong (1e-3: 100x the tolerance)."""
    batch = rte_batch(tiny_base(name), "left")
    on, without = _eager_attentions(name, batch), _eager_attentions(name, batch, **off)
    changed = max(float((a - b).abs().max()) for a, b in zip(on, without))
    assert changed > 1e-3, f"{mechanism} barely changes {name}'s attention ({changed:.3g})"


def test_gpt_oss_rows_sum_below_one_in_eager(tiny_base):
    """The learned sink takes real mass in the tiny gpt-oss (else exactness of the sink would prove nothing)."""
    batch = rte_batch(tiny_base("tiny-gpt-oss"), "left")
    valid = batch.attention_mask.bool()[:, None, :]
    missing = max(
        float((1 - a.sum(-1))[valid.expand(-1, a.shape[1], -1)].max()) for a in _eager_attentions("tiny-gpt-oss", batch)
    )
    assert missing > 1e-2


def test_parallel_blocks_and_windows_follow_the_model(tiny_base):
    assert tiny_base("tiny-gpt-neox").config.use_parallel_residual
    assert tiny_base("tiny-falcon").config.parallel_attn
    assert "parallel attention and MLP" not in tiny_base("tiny-llama").adapter.found.mechanisms
    masks = {
        name: tiny_base(name).adapter.found.masks["decoder"]
        for name in ("tiny-gemma3", "tiny-mistral", "tiny-llama", "tiny-llama4-text")
    }
    assert [m[1] for m in masks["tiny-gemma3"]] == [8, 8, None, 8]
    assert masks["tiny-mistral"] == (("sliding", 8),) * 4
    assert masks["tiny-llama"] == (("full", None),) * 4
    assert masks["tiny-llama4-text"] == (("chunked", 8), ("full", None), ("chunked", 8), ("full", None))


def reference_deep_prompt(base, batch, prompts: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] with prompts[i] [n, d] spliced before the first valid token of every layer i, by hand."""
    blocks = base.adapter.blocks(base.model, "decoder")
    index = first_valid(batch.attention_mask)
    valid = batch.attention_mask.bool()
    b, n = valid.shape[0], prompts.shape[1]
    vn = insert_rows(valid, index, torch.ones(b, n, dtype=torch.bool))
    x = run_block(base.model, blocks[0], batch.input_ids, batch.attention_mask, read="input")
    for i, block in enumerate(blocks):
        out = run_block(base.model, block, inputs=insert_rows(x, index, prompts[i].expand(b, n, -1)), mask=vn.long())
        x = drop_rows(out, index, n)
    return run_block(base.model, blocks[-1], batch.input_ids, batch.attention_mask, read="logits", output=x)


@pytest.mark.parametrize("name", DECODERS)
def test_deep_prompt_equals_hand_loop(tiny_base, name):
    """Left padding: inserted positions sit mid-sequence (the capsule reference covers both sides)."""
    padding_side = "left"
    base = tiny_base(name)
    batch = rte_batch(base, padding_side)
    guided = load_guided("deep-prompt:n=2", base=base, seed=2)
    prompts = guided.guidance_state_dict()["0.prompts.decoder"]  # [layers, n, d]
    with torch.no_grad():
        got = guided.forward(batch).logits
        want = reference_deep_prompt(base, batch, prompts)
    diff = float((got - want).abs()[batch.attention_mask.bool()].max())
    print(f"deep prompt {name} {padding_side}: max abs diff {diff:.2e}")
    assert diff <= 1e-5


@pytest.mark.parametrize("name", PREFIX)
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_prefix_equals_peft_prefix_tuning(tmp_path, name):
    """A PEFT prefix-tuning adapter (the real library) gives the same logits through anchorlens."""
    peft = pytest.importorskip("peft")
    from anchorlens.models.loading import load_base

    fresh = load_base(name)  # PEFT wraps the model object
    model = peft.get_peft_model(
        fresh.model, peft.PrefixTuningConfig(task_type=peft.TaskType.CAUSAL_LM, num_virtual_tokens=3)
    )
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.prompt_encoder.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    model.eval()
    model.save_pretrained(str(tmp_path / "adapter"))
    batch = rte_batch(fresh, "left")
    guided = load_guided(str(tmp_path / "adapter"), base=load_base(name))
    with torch.no_grad():
        want = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        got = guided.forward(batch).logits
        plain = fresh.forward(batch).logits
    assert float((got - plain).abs().max()) > 1e-3, "the prefix must change the logits"
    diff = float((got - want).abs()[batch.attention_mask.bool()].max())
    print(f"prefix {name}: max abs diff {diff:.2e}")
    assert diff <= 1e-5


def test_bidirectional_gemma3_is_discovered_as_an_encoder(tiny_base):
    """EmbeddingGemma's bidirectional attention is captured as an encoder stack (exact), with no guidance."""
    from anchorlens.models.base import Base
    from anchorlens.models.loading import discovered_adapter
    from tests.capture.helpers import Collect, eager_attentions

    spec = tiny_spec("tiny-gemma3")
    tok = tiny_tokenizer(spec.style)
    config = spec.config(tok)
    config.use_bidirectional_attention = True
    torch.manual_seed(0)
    model = spec.model_cls(config).eval()
    base = Base("bidirectional-gemma3", model, tok, discovered_adapter(model))
    assert base.adapter.stacks() == ("encoder",) and not base.adapter.supports_guidance
    from anchorlens.capture.run import capture_batch

    batch = rte_batch(base, "right")
    sink = Collect()
    capture_batch(base, batch, sink)
    reference = eager_attentions(base, batch)["encoder"]
    rows = batch.attention_mask.bool()[:, None, :, None]
    assert max(float(((e.full_probs() - reference[e.layer]).abs() * rows).max()) for e in sink.events) <= 1e-5
    with pytest.raises(UsageError, match="bidirectional encoder: it supports capture only") as err:
        load_guided("capsule", base=base)
    assert "\n" not in str(err.value)


def test_a_splice_needs_the_layer(tiny_base):
    """Sliding/global or per-type rotary layers cannot be spliced without knowing the layer (never guessed)."""
    base = tiny_base("tiny-gemma3")
    with pytest.raises(TypeError, match="layer index"):
        base.adapter.splice_block_inputs(base.model, "decoder", (), {}, None, None, None, {})


@pytest.mark.parametrize("name", ["tiny-mistral", "tiny-gemma3", "tiny-llama4-text"])  # no mask while T < window
def test_short_unpadded_input_gets_its_window_once_spliced(tiny_base, name):
    """T < window: transformers passes no mask (plain causal); T+N > window: the splice must add the band."""
    from anchorlens.tasks import bundled_examples, get_task

    base = tiny_base(name)
    task = get_task("rte")
    batch = base.encode([task.template.render(bundled_examples("rte")[0])], max_length=7)
    assert batch.input_ids.shape == (1, 7) and bool(batch.attention_mask.all())
    guided = load_guided("deep-prompt:n=3", base=base, seed=4)
    prompts = guided.guidance_state_dict()["0.prompts.decoder"]
    with torch.no_grad():
        got = guided.forward(batch).logits
        want = reference_deep_prompt(base, batch, prompts)
    assert float((got - want).abs().max()) <= 1e-5
