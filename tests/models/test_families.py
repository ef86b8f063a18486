"""Decoder families: the tiny bases exercise each family's mechanism, deep prompts and prefixes are exact on
each, unknown or unmirrorable architectures are refused with one line."""

from __future__ import annotations

import hashlib

import pytest
import torch

from anchorlens.errors import UnknownNameError, UsageError
from anchorlens.methods.spec import load_guided
from anchorlens.models.adapters import FAMILIES, adapter_for
from anchorlens.models.adapters.decoder import sliding_windows
from anchorlens.models.tiny import TINY_BASES, build_tiny, tiny_spec
from anchorlens.models.tiny_tokenizers import tiny_tokenizer
from tests.methods.helpers import drop_rows, first_valid, insert_rows, rte_batch, run_block

DECODERS = [n for n in TINY_BASES if n not in ("tiny-bert", "tiny-t5")]


def test_every_family_has_a_tiny_base():
    families = {
        adapter_for(tiny_spec(name).config(tiny_tokenizer(tiny_spec(name).style)).model_type).family
        for name in TINY_BASES
    }
    assert families == set(FAMILIES)


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
    spec = tiny_spec(name)
    config = spec.config(tiny_tokenizer(spec.style))
    for key, value in overrides.items():
        setattr(config, key, value)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = spec.model_cls(config).eval()
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
]


@pytest.mark.parametrize("name,mechanism,off", MECHANISMS, ids=[f"{n}-{m}" for n, m, _ in MECHANISMS])
def test_tiny_configs_exercise_the_family_mechanism(tiny_base, name, mechanism, off):
    """Without this, exactness on the tiny bases could hold while the mechanism is mirrored wrong (1e-3: 100x the tolerance)."""
    batch = rte_batch(tiny_base(name), "left")
    on, without = _eager_attentions(name, batch), _eager_attentions(name, batch, **off)
    changed = max(float((a - b).abs().max()) for a, b in zip(on, without))
    assert changed > 1e-3, f"{mechanism} barely changes {name}'s attention ({changed:.3g})"


def test_neox_is_parallel_residual_and_windows_follow_layer_types(tiny_base):
    assert tiny_base("tiny-gpt-neox").config.use_parallel_residual
    gemma3 = tiny_base("tiny-gemma3")
    assert sliding_windows(gemma3.config, 4) == [8, 8, None, 8]
    assert sliding_windows(tiny_base("tiny-mistral").config, 4) == [8] * 4
    assert sliding_windows(tiny_base("tiny-llama").config, 4) == [None] * 4


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


@pytest.mark.parametrize("name", DECODERS)
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


def test_unknown_architecture_is_one_line_listing_the_families():
    with pytest.raises(UnknownNameError) as err:
        adapter_for("falcon")
    message = str(err.value)
    assert "\n" not in message and "'falcon'" in message
    assert all(t in message for t in ("llama", "gemma2", "gemma3_text", "gpt_neox", "olmo2", "phi3", "t5"))


def test_bidirectional_gemma3_is_refused(tiny_base):
    config = tiny_base("tiny-gemma3").config.__class__(use_bidirectional_attention=True)
    for form in (config, config.to_dict()):  # a loaded config or config.json read before any download
        with pytest.raises(UsageError, match="cannot be captured exactly") as err:
            adapter_for(form)
        assert "\n" not in str(err.value)
    with pytest.raises(UnknownNameError):
        adapter_for({"model_type": "gemma3"})  # the multimodal Gemma 3 is not the text family
    assert adapter_for(tiny_base("tiny-gemma3").config).family == "gemma3"


@pytest.mark.parametrize("name", ["tiny-gemma2", "tiny-gemma3", "tiny-qwen2"])
def test_layer_dependent_families_need_the_layer_to_splice(tiny_base, name):
    """Sliding/global or per-type rotary layers cannot be spliced without knowing the layer (never guessed)."""
    base = tiny_base(name)
    adapter = base.adapter
    windows = adapter.windows(base.model)
    if len(set(windows)) == 1 and not adapter.layout.rotary_by_layer_type:
        assert adapter._layer_window(base.model, None) == windows[0]
        return
    with pytest.raises(TypeError, match="layer index"):
        adapter._layer_window(base.model, None) if len(set(windows)) > 1 else adapter._layer_type(base.model, None)


@pytest.mark.parametrize("name", ["tiny-mistral", "tiny-gemma3"])  # sdpa families: no mask while T < window
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
