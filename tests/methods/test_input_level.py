"""Input-level positions (soft prompt, instance token) equal ``inputs_embeds`` concatenation exactly."""

from __future__ import annotations

import pytest
import torch

from anchorlens.methods.spec import load_guided
from anchorlens.models.verified import verified_bases

from .helpers import drop_rows, first_valid, insert_rows, masked_mean, rte_batch

DECODERS = verified_bases(kind="decoder")


def _concat_logits(base, batch, vectors: torch.Tensor, index: list[int]) -> torch.Tensor:
    """Logits [B, T, V] of the model run on embeddings with ``vectors`` [B, n, d] inserted by hand."""
    embeds = base.model.get_input_embeddings()(batch.input_ids)
    x = insert_rows(embeds, index, vectors)
    mask = insert_rows(batch.attention_mask, index, torch.ones_like(batch.attention_mask[:, : vectors.shape[1]]))
    logits = base.model(inputs_embeds=x, attention_mask=mask, use_cache=False).logits
    return drop_rows(logits, index, vectors.shape[1])


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("n", [1, 3])
def test_soft_prompt_equals_inputs_embeds_concatenation(tiny_base, name, padding_side, n):
    base = tiny_base(name)
    batch = rte_batch(base, padding_side)
    guided = load_guided(f"prompt:n={n},init=random", base=base, seed=1)
    prompt = guided.guidance_state_dict()["0.prompt"]  # [n, d]
    with torch.no_grad():
        got = guided.forward(batch).logits
        want = _concat_logits(base, batch, prompt.expand(batch.batch_size, n, -1), first_valid(batch.attention_mask))
    diff = float((got - want).abs().max())
    print(f"soft prompt n={n} {name} {padding_side}: max abs diff {diff:.2e}")
    assert diff == 0.0


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_instance_token_equals_concatenated_mean(tiny_base, name, padding_side):
    base = tiny_base(name)
    batch = rte_batch(base, padding_side)
    guided = load_guided("instance", base=base)
    with torch.no_grad():
        got = guided.forward(batch).logits
        embeds = base.model.get_input_embeddings()(batch.input_ids)
        mean = masked_mean(embeds, batch.attention_mask.bool()).unsqueeze(1)
        want = _concat_logits(base, batch, mean, first_valid(batch.attention_mask))
    diff = float((got - want).abs().max())
    print(f"instance {name} {padding_side}: max abs diff {diff:.2e}")
    assert diff <= 1e-6


def test_instance_chunks_are_chunk_means(tiny_base):
    base = tiny_base("tiny-llama")
    batch = rte_batch(base, "left")
    g = load_guided("instance:k=3,mode=chunks", base=base).guidances[0]
    embeds = base.model.get_input_embeddings()(batch.input_ids)
    vecs = g.input_vectors(embeds, batch.attention_mask.bool())
    assert vecs.shape == (batch.batch_size, 3, base.hidden_size)
    idx = batch.attention_mask[0].nonzero().view(-1)
    parts = torch.tensor_split(idx, 3)
    torch.testing.assert_close(vecs[0, 1], embeds[0, parts[1]].mean(0))
    assert len(parts[0]) + len(parts[1]) + len(parts[2]) == len(idx)
