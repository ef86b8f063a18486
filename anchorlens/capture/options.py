"""How a capture session computes: output mode and the memory budget of the recompute."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from anchorlens.engine.call import DEFAULT_MEMORY_BUDGET
from anchorlens.errors import UsageError

MODES = ("auto", "fast", "strict")
PLANS = ("auto", "kernel", "materialised")


@dataclass(frozen=True)
class CaptureOptions:
    """Options of a capture session.

    mode: ``"auto"`` (default) is ``fast`` when the caller does not need logits (statistics and maps
    runs) and ``strict`` when it does. ``"fast"`` computes the probabilities of a captured site once and its output as
    ``probs @ V``: probabilities exact, output equal to sdpa's up to float rounding (~1e-6, not
    bitwise). ``"strict"`` keeps sdpa's output bit for bit and recomputes the probabilities of the
    selected heads separately (slower). memory_budget: bytes the recompute's float32 buffers may use
    at once; queries are processed in chunks to stay under it (events then carry a query slice).
    plan: how statistics are computed (:mod:`anchorlens.engine.plan`): ``"materialised"`` computes the probabilities
    in float32 chunks, ``"kernel"`` takes them from a fused kernel's log-sum-exp without materialising them
    (:mod:`anchorlens.engine.kernel`; refused in one line where the reducers read the maps themselves or a module's
    attention rules it out), ``"auto"`` (default) the cheaper of the two that gives what the reducers read.
    """

    mode: Literal["auto", "fast", "strict"] = "auto"
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    plan: Literal["auto", "kernel", "materialised"] = "auto"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"capture mode {self.mode!r} is unknown: use one of {', '.join(MODES)}")
        if self.plan not in PLANS:
            raise UsageError(f"capture plan {self.plan!r} is unknown: use one of {', '.join(PLANS)}")
        if int(self.memory_budget) <= 0:
            raise UsageError(f"memory budget {self.memory_budget} must be a positive number of bytes")

    def resolved(self, need_logits: bool) -> CaptureOptions:
        """These options with ``auto`` replaced by ``strict`` (logits needed) or ``fast`` (not needed)."""
        if self.mode != "auto":
            return self
        return replace(self, mode="strict" if need_logits else "fast")
