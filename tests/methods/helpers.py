"""Test helpers for guided models: padded batches, a collecting sink, hand-written splicing."""

from __future__ import annotations

from dataclasses import replace

import torch

from anchorlens.tasks import bundled_examples, get_task


class Collect:
    """Sink that keeps every event (tests only)."""

    def __init__(self) -> None:
        self.events: list = []

    def consume(self, event) -> None:
        # probs and logits live in buffers the capture reuses for the next call: keep copies
        scores = None if event.scores is None else event.scores.clone()
        self.events.append(replace(event, probs=event.probs.clone(), scores=scores, cache={}))


def rte_batch(base, padding_side: str = "right", n: int = 3):
    """A padded batch of ``n`` bundled RTE examples."""
    task = get_task("rte")
    examples = bundled_examples("rte")[:n]
    old = base.tokenizer.padding_side
    base.tokenizer.padding_side = padding_side
    try:
        batch = base.encode([task.template.render(ex) for ex in examples])
    finally:
        base.tokenizer.padding_side = old
    assert batch.attention_mask.min() == 0, "the batch must contain padding"
    return batch


def insert_rows(x: torch.Tensor, index: list[int], new: torch.Tensor) -> torch.Tensor:
    """Per example b: x[b, :i] ++ new[b] ++ x[b, i:] (x [B, T, ...], new [B, n, ...])."""
    return torch.stack([torch.cat([x[b, :i], new[b], x[b, i:]]) for b, i in enumerate(index)])


def drop_rows(x: torch.Tensor, index: list[int], n: int) -> torch.Tensor:
    """Per example b: x[b] without rows [i, i+n)."""
    return torch.stack([torch.cat([x[b, :i], x[b, i + n :]]) for b, i in enumerate(index)])


def first_valid(mask: torch.Tensor) -> list[int]:
    """Index of the first valid token per example."""
    return [int(row.nonzero()[0]) for row in mask]


def after_last_valid(mask: torch.Tensor) -> list[int]:
    """Index right after the last valid token per example."""
    return [int(row.nonzero()[-1]) + 1 for row in mask]


def masked_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over valid positions: x [B, T, d], valid [B, T] -> [B, d]."""
    w = valid.float().unsqueeze(-1)
    return (x * w).sum(1) / w.sum(1)


class _Stop(Exception):
    """Raised by a hook once the block of interest has run (the rest of the forward is not needed)."""


def _hidden_arg(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _block_output(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def run_block(model, block, input_ids=None, attention_mask=None, *, inputs=None, mask=None, read="output", output=None):
    """Run one decoder block inside the HF model's own forward, so masks, positions and rotary are the model's.

    - ``read="input"``: hidden states [B, T, d] entering ``block`` in a plain forward of ``input_ids``.
    - ``read="output"``: the output [B, L, d] of ``block`` fed ``inputs`` [B, L, d] with 2D ``mask`` [B, L]
      (the model sees a length-L input; earlier blocks run on zeros and are ignored).
    - ``read="logits"``: logits [B, T, V] of a plain forward of ``input_ids`` whose ``block`` (the last)
      outputs ``output`` [B, T, d]: final norm, head and soft-capping are the model's.
    """
    seen: dict = {}

    def pre(module, args, kwargs):
        if read == "input":
            seen["x"] = _hidden_arg(args, kwargs)
            raise _Stop
        if read == "output":
            return _with_hidden(args, kwargs, inputs)
        return None

    def post(module, args, kwargs, out):
        if read == "output":
            seen["x"] = _block_output(out)
            raise _Stop
        return (output, *out[1:]) if isinstance(out, tuple) else output

    handles = [
        block.register_forward_pre_hook(pre, with_kwargs=True),
        block.register_forward_hook(post, with_kwargs=True),
    ]
    try:
        if read == "output":
            model(inputs_embeds=torch.zeros_like(inputs), attention_mask=mask, use_cache=False)
        else:
            out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            if read == "logits":
                return out.logits
    except _Stop:
        return seen["x"]
    finally:
        for h in handles:
            h.remove()
    raise AssertionError(f"block never ran (read={read})")


def logits_with_attention(model, batch, implementation: str) -> torch.Tensor:
    """Logits of ``model`` (a GuidedModel) on ``batch`` with the base's attention implementation switched to
    ``implementation`` for this forward only (a registered reference, ``eager``...)."""
    hf = model.base.model
    before = hf.config._attn_implementation
    hf.set_attn_implementation(implementation)
    try:
        with torch.no_grad():
            return model.forward(batch).logits
    finally:
        hf.set_attn_implementation(before)
