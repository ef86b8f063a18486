"""Which self-attention stacks a layer-level guidance inserts into."""

from __future__ import annotations

from anchorlens.errors import UsageError


def choose_layer_stacks(adapter, requested: tuple[str, ...] | None, kind: str) -> tuple[str, ...]:
    """``requested`` checked against the adapter's insertable stacks, or all of them when None."""
    allowed = tuple(adapter.guidance_stacks)
    if not allowed:
        why = getattr(adapter, "layer_guidance_refusal", None)
        raise UsageError(
            f"{kind} needs a base that accepts per-layer positions; {adapter.family} does not"
            + (f": {why}" if why else "")
        )
    if requested is None:
        return allowed
    bad = [s for s in requested if s not in allowed]
    if bad:
        raise UsageError(f"{kind}: unknown stack {bad[0]!r} for {adapter.family}; choose from: {', '.join(allowed)}")
    return tuple(requested)


def layers_of(base, requested: tuple[str, ...] | None, kind: str) -> dict[str, int]:
    """Layers per chosen stack of ``base`` (for size estimates before allocating)."""
    adapter = base.adapter
    return {s: adapter.num_layers(base.model, s) for s in choose_layer_stacks(adapter, requested, kind)}
