"""The first pass a model's knockouts may need (``mode=mean``): one forward over the run's inputs, before the run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from anchorlens.capture.collect import PromptRenderer, encode_batches


def first_pass(
    model: Any, rows: Sequence[Mapping], prompts: PromptRenderer, *, batch_size: int = 8, max_length: int | None = None
) -> list[dict[str, Any]]:
    """Give ``model``'s ``mode=mean`` knockouts their dataset means from ``rows`` (rendered by ``prompts``, encoded as
    the run encodes them), unless they have them; the records (per knockout: examples, keys, norm of the mean per
    layer) are also in ``model.meta["first_pass"]``. [] when no knockout needs a pass."""
    if not getattr(model, "needs_first_pass", lambda: False)():
        return list(getattr(model, "meta", {}).get("first_pass", []))
    batches = encode_batches(model, rows, prompts, batch_size=batch_size, max_length=max_length)
    return model.prepare(batches)


def first_pass_facts(models: Mapping[str, Any]) -> dict[str, Any]:
    """``{"first_pass": {name: records}}`` for the models whose knockouts made a first pass, else {} (a manifest's
    facts)."""
    done = {name: m.meta["first_pass"] for name, m in models.items() if getattr(m, "meta", {}).get("first_pass")}
    return {"first_pass": done} if done else {}
