"""Turn a checkpoint spec into something capture can run: a Base or a GuidedModel."""
from __future__ import annotations

from anchorlens.models.base import Base
from anchorlens.models.loading import load_base


def load_model(spec: str, base: Base | str = "smollm2-135m", dtype: str | None = None):
    """``base`` -> the Base itself; any other spec -> a GuidedModel over the (shared) base."""
    if isinstance(base, str):
        base = load_base(base, dtype=dtype)
    if spec.strip() == "base":
        return base
    from anchorlens.methods.spec import load_guided

    return load_guided(spec, base=base)
