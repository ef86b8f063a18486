"""Checkpoints on different bases in one comparison: ``--ckpt model=ORG/NAME`` or ``model=DIR[+spec]``.

A model against its instruct version or its fine-tune: each ``model=`` checkpoint runs on its own base,
every other checkpoint on ``--base``. The run's base (whose tokenizer renders the prompts) is the first
checkpoint's, the paired baseline. All of them must see the same tokens: a base is accepted when its
vocabulary equals the run base's and it tokenizes every rendered example of the run into the same ids and
roles; otherwise one line says which differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from anchorlens.errors import UsageError
from anchorlens.methods.spec import load_guided
from anchorlens.models.base import Base
from anchorlens.models.loading import load_base
from anchorlens.tasks.prompts import Prompts
from anchorlens.workflows.first_pass import first_pass, first_pass_facts

MODEL_KEY = "model="
_CHUNK = 64


def split_model(ckpt: str) -> tuple[str | None, str]:
    """``model=X+spec`` -> (X, spec); ``model=X`` -> (X, ``base``); any other spec -> (None, spec).

    A local directory whose name holds ``+`` is kept whole (the longest existing path wins).
    """
    text = ckpt.strip()
    if not text.lower().startswith(MODEL_KEY):
        return None, ckpt
    rest = text[len(MODEL_KEY) :]
    cuts = [i for i, c in enumerate(rest) if c == "+"] + [len(rest)]
    cut = next((i for i in reversed(cuts) if Path(rest[:i]).expanduser().exists()), cuts[0])
    model, spec = rest[:cut].strip(), rest[cut + 1 :].strip()
    if not model:
        raise UsageError(
            f"--ckpt {ckpt!r} names no model after 'model='; write model=ORG/NAME or model=DIR, "
            "optionally with a spec (model=DIR+instance)"
        )
    return model, spec or "base"


def run_base_spec(ckpts: Sequence[str], base: str) -> str:
    """The spec of the run's base: the first checkpoint's ``model=``, else ``base``."""
    model, _ = split_model(ckpts[0])
    return model or base


def _vocab_problem(reference: Base, other: Base) -> str | None:
    """Why the two tokenizers' vocabularies differ, or None when they are equal."""
    mine, theirs = reference.tokenizer.get_vocab(), other.tokenizer.get_vocab()
    if mine == theirs:
        return None
    differ = len(set(mine.items()) ^ set(theirs.items()))
    return f"their vocabularies differ ({len(mine)} vs {len(theirs)} tokens, {differ} entries not shared)"


def _tokens_problem(
    reference: Base, other: Base, prompts: Prompts, rows: Sequence, max_length: int | None
) -> str | None:
    """Why the run's rendered examples tokenize differently on ``other`` (first difference), or None."""
    rendered = [prompts.render(row) for row in rows]

    def limit(b: Base) -> int | None:
        found = [x for x in (max_length, b.context_length) if x is not None]
        return min(found) if found else None

    for start in range(0, len(rendered), _CHUNK):
        chunk = rendered[start : start + _CHUNK]
        ours = reference.encode(chunk, max_length=limit(reference), scheme=prompts.scheme)
        theirs = other.encode(chunk, max_length=limit(other), scheme=prompts.scheme)
        for row in range(len(chunk)):
            a = ours.input_ids[row][ours.attention_mask[row].bool()].tolist()
            b = theirs.input_ids[row][theirs.attention_mask[row].bool()].tolist()
            roles_a = ours.roles[row][ours.attention_mask[row].bool()].tolist()
            roles_b = theirs.roles[row][theirs.attention_mask[row].bool()].tolist()
            if a == b and roles_a == roles_b:
                continue
            where = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if where is None and len(a) == len(b):
                return f"example {start + row} gets other token roles"
            if where is None:
                return f"example {start + row} has {len(a)} tokens with one and {len(b)} with the other"
            pieces = (
                reference.tokenizer.convert_ids_to_tokens([a[where]]),
                other.tokenizer.convert_ids_to_tokens([b[where]]),
            )
            return f"example {start + row} differs at token {where} ({pieces[0][0]!r} vs {pieces[1][0]!r})"
    return None


def check_same_tokens(
    reference: Base, other: Base, prompts: Prompts, rows: Sequence, max_length: int | None, ckpt: str
) -> None:
    """UsageError (one line, naming ``ckpt`` and why) unless ``other`` turns the run's examples into the same tokens."""
    why = _vocab_problem(reference, other) or _tokens_problem(reference, other, prompts, rows, max_length)
    if why is not None:
        raise UsageError(
            f"--ckpt {ckpt}: the base {other.spec!r} does not share the tokenizer of the run's base {reference.spec!r}: "
            f"{why}; compare runs every checkpoint on the same tokens, so compare bases that share a tokenizer "
            "(a model and its instruct version or fine-tune)"
        )


def load_models(
    ckpts: Sequence[str],
    names: Sequence[str],
    shared: Base,
    base: str,
    *,
    prompts: Prompts,
    rows: Sequence,
    max_length: int | None = None,
    dtype: str | None = None,
    device: str | None = None,
    allow_other_base: bool = False,
    batch_size: int = 8,
) -> tuple[dict[str, Any], dict[str, Base]]:
    """(name -> GuidedModel, name -> its base) for every checkpoint; ``model=`` ones on their own (checked) base.

    ``shared`` is the run's base (spec :func:`run_base_spec`); ``base``: the spec the other checkpoints use.
    Each base is loaded once and checked once against ``prompts``/``rows`` before any checkpoint loads on it; a
    checkpoint whose knockouts need a first pass (``mode=mean``) makes it over ``rows`` (``batch_size``).
    """
    bases: dict[str, Base] = {shared.spec: shared}
    models: dict[str, Any] = {}
    used: dict[str, Base] = {}
    for name, ckpt in zip(names, ckpts):
        model_spec, spec = split_model(ckpt)
        key = model_spec or base
        if key not in bases:
            loaded = load_base(key, dtype=dtype, device=device)
            check_same_tokens(shared, loaded, prompts, rows, max_length, ckpt)
            bases[key] = loaded
        models[name] = load_guided(spec, bases[key], allow_other_base=allow_other_base)
        first_pass(models[name], rows, prompts, batch_size=batch_size, max_length=max_length)
        used[name] = bases[key]
    return models, used


def multibase_facts(shared: Base, used: dict[str, Base], models: dict[str, Any]) -> dict[str, Any]:
    """Facts of a run whose checkpoints ran on several bases (empty when all ran on the run's base), of the
    PEFT layer adapters applied and of the knockouts' first passes."""
    facts: dict[str, Any] = {}
    if any(b is not shared for b in used.values()):
        facts["bases"] = {
            name: {"spec": b.spec, "fingerprint": b.fingerprint(), "provenance": b.provenance()}
            for name, b in used.items()
        }
        facts["tokenizer_check"] = {"reference": shared.spec, "vocab_size": len(shared.tokenizer.get_vocab())}
    adapters = {name: m.meta["peft_adapter"] for name, m in models.items() if m.meta.get("peft_adapter")}
    if adapters:
        facts["peft_adapters"] = adapters
    return {**facts, **first_pass_facts(models)}
