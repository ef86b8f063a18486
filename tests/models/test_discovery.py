"""Discovery: the layout comes from what the model does; what it cannot serve is one line naming the reason."""

from __future__ import annotations

import pytest
import torch

from anchorlens.capture.run import capture_batch, check_selection
from anchorlens.capture.selection import Selection
from anchorlens.errors import UsageError
from anchorlens.methods.spec import load_guided
from anchorlens.models.adapters import OVERRIDES, adapter_for, discover
from anchorlens.models.adapters.probe import PROBE_LEN, run_probe
from anchorlens.models.tiny_any import build_tiny_any
from anchorlens.models.tiny_tokenizers import tiny_tokenizer
from tests.capture.helpers import Collect
from tests.methods.helpers import rte_batch


def _refusal(model_type: str) -> str:
    model = build_tiny_any(model_type, tiny_tokenizer("llama"))
    with pytest.raises(UsageError) as err:
        adapter_for(model)
    message = str(err.value)
    assert "\n" not in message and message.startswith(model_type)
    return message


def test_attention_written_inline_is_refused_in_one_line():
    """Bloom computes attention itself (no AttentionInterface): transformers will not swap it, nor can capture."""
    assert "bypasses transformers' AttentionInterface" in _refusal("bloom")


def test_a_model_without_softmax_attention_is_refused_in_one_line():
    assert "no module called transformers' AttentionInterface" in _refusal("mamba")


def test_sites_are_the_modules_that_called_the_interface(tiny_base):
    base = tiny_base("tiny-llama")
    found = base.adapter.found
    assert [s.path for s in found.sites] == [f"model.layers.{i}.self_attn" for i in range(4)]
    assert found.stacks["decoder"].blocks == "model.layers" and found.stacks["decoder"].causal
    args = found.block_args["decoder"]
    assert args.roles["attention_mask"] == "mask" and args.roles["position_ids"] == "positions"
    assert args.rotary["position_embeddings"] == ("model.rotary_emb",) * 4
    t5 = tiny_base("tiny-t5").adapter.found
    assert {s.stack for s in t5.sites} == {"encoder", "decoder", "cross"}
    assert [s.path for s in t5.sites_of("cross")] == [f"decoder.block.{i}.layer.1.EncDecAttention" for i in range(3)]
    assert set(OVERRIDES) == {"t5", "mt5"} and all(reason for _, reason in OVERRIDES.values())


def test_kv_geometry_is_read_from_the_calls(tiny_base):
    assert tiny_base("tiny-qwen2").adapter.kv_geometry(None) == (4, 2, 16)
    assert tiny_base("tiny-falcon").adapter.kv_geometry(None) == (4, 1, 16)  # multi-query
    assert tiny_base("tiny-gpt2").adapter.kv_geometry(None) == (4, 4, 16)


@pytest.mark.parametrize("name,kind", [("tiny-qwen3-5-text", "linear_attention"), ("tiny-lfm2", "conv")])
def test_hybrid_layers_without_softmax_are_listed_and_not_selectable_alone(tiny_base, name, kind):
    base = tiny_base(name)
    assert base.adapter.found.other_layers("decoder") == {kind: [0, 2]}
    assert base.num_layers == 4 and [s.layer for s, _ in base.sites()] == [1, 3]
    sink = Collect()
    capture_batch(base, rte_batch(base, "left"), sink, Selection(layers=(-1,)))
    assert [e.layer for e in sink.events] == [3]  # -1 counts every block, not only the attention ones
    with pytest.raises(UsageError, match=r"only layers without softmax attention .*attention layers are 1, 3") as err:
        check_selection(load_guided("base", base=base), Selection(layers=(0, 2)))
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="out of range: this base has 4 layers"):
        check_selection(load_guided("base", base=base), Selection(layers=(4,)))
    with pytest.raises(UsageError, match="no keys for a prefix"):
        load_guided("prefix:n=2", base=base)


def test_a_block_argument_that_depends_on_the_sequence_refuses_guidance():
    """An argument a splice cannot extend (here a per-position tensor the blocks are said to receive) makes
    guidance a one-line refusal naming it; capture is unaffected."""
    model = build_tiny_any("llama", tiny_tokenizer("llama"))
    records = run_probe(model)
    for call in records.blocks:
        call.args["per_position"] = ("tensor", (2, PROBE_LEN, 3), torch.float32)
    found = discover(model, records)
    assert found.guidance_refusal == (
        "llama's blocks take per_position, which depends on the sequence and anchorlens cannot extend"
    )
    assert len(found.sites) == 4
