"""The first pass a model's knockouts may need (``mode=mean``): one forward over the run's inputs, before the run."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from anchorlens.capture.collect import PromptRenderer, encode_batches


def first_pass(
    model: Any, rows: Sequence[Mapping], prompts: PromptRenderer, *, batch_size: int = 8, max_length: int | None = None
) -> list[dict[str, Any]]:
    """Give ``model``'s ``mode=mean`` knockouts their dataset means from ``rows`` (rendered by ``prompts``, encoded as
    the run encodes them), unless they have them; the records (per knockout: examples, keys, norm of the mean per
    layer) are also in ``model.meta["first_pass"]``. [] when no knockout needs a pass.

    A ``keys=pos=N`` knockout beyond every input of the run is refused first (:func:`check_knockout_reach`)."""
    check_knockout_reach(model, rows, prompts, batch_size=batch_size, max_length=max_length)
    if not getattr(model, "needs_first_pass", lambda: False)():
        return list(getattr(model, "meta", {}).get("first_pass", []))
    batches = encode_batches(model, rows, prompts, batch_size=batch_size, max_length=max_length)
    return model.prepare(batches)


def check_knockout_reach(
    model: Any, rows: Sequence[Mapping], prompts: PromptRenderer, *, batch_size: int = 8, max_length: int | None = None
) -> None:
    """UsageError (one line) before any forward when one of ``model``'s ``keys=pos=N`` knockouts lies beyond every
    input (tokenized as the run encodes them): it would remove nothing and the run would measure the model unchanged."""
    knockouts = [ko for ko in getattr(model, "knockout_list", list)() if ko.config.key_position() not in (None, 0)]
    if not knockouts or not len(rows):
        return
    lengths: list[int] = []
    with warnings.catch_warnings():  # the run itself warns about truncation, once
        warnings.simplefilter("ignore")
        for batch in encode_batches(model, rows, prompts, batch_size=batch_size, max_length=max_length):
            counts = batch.attention_mask.sum(1)
            if batch.target_mask is not None:  # an encoder-decoder's decoder side: its own keys
                counts = torch.maximum(counts, batch.target_mask.sum(1))
            lengths.extend(int(x) for x in counts.tolist())
    inserted = sum(int(g.count()) for g in model.guidance_list())
    for ko in knockouts:
        ko.check_reach(lengths, inserted)


def first_pass_facts(models: Mapping[str, Any]) -> dict[str, Any]:
    """``{"first_pass": {name: records}}`` for the models whose knockouts made a first pass, else {} (a manifest's
    facts)."""
    done = {name: m.meta["first_pass"] for name, m in models.items() if getattr(m, "meta", {}).get("first_pass")}
    return {"first_pass": done} if done else {}
