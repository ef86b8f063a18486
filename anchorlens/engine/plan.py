"""Which plan computes an observed attention call: a fused kernel's log-sum-exp, or materialised probabilities.

The observer (a capture) says what its sink reads (:mod:`~anchorlens.engine.quantities`) and which plan it asks
for (its options' ``plan``). ``materialised`` always works. ``kernel`` needs every quantity read to be one the
kernel plan gives and the call to be one the kernel computes exactly (:func:`~anchorlens.engine.kernel.kernel_refusal`);
asked for explicitly, anything else is one line naming the reducer, the quantity or the reason, and the site — never
a silent fallback. ``auto`` takes the kernel plan where it may and where its passes cost less than materialising
(:data:`AUTO_MAX_PASSES`: on a CPU, where the materialised plan's matrix products run about as fast as the flash
kernel, when the statistics need no pass beyond the output's, from :data:`AUTO_LONG_KEYS` keys on when they need
one more, as an entropy does, and from :data:`AUTO_ANY_PASSES_KEYS` keys on at any number of passes).
"""

from __future__ import annotations

from collections.abc import Callable

from anchorlens.engine.quantities import KERNEL_QUANTITIES
from anchorlens.errors import UsageError

KERNEL = "kernel"
MATERIALISED = "materialised"
# the most kernel passes ``auto`` takes the kernel plan for, per device type, below and from a number of keys:
# measured against the materialised plan with ``benchmarks/bench_long_inputs.py`` (docs/performance.md: on a CPU
# the kernel plan with one extra pass costs more than materialising up to 4,096 tokens and less at 8,192, where the
# materialised plan's float32 chunks outgrow the caches); device types absent here always materialise
AUTO_MAX_PASSES = {"cpu": 1}
AUTO_LONG_KEYS = {"cpu": 8192}
AUTO_MAX_PASSES_LONG = {"cpu": 2}
# from this many keys on, auto takes the kernel plan at any number of passes: the materialised plan keeps each query
# chunk's visibility for the layers of a forward (5 bytes per query and key: 1.25 GiB at 16,384 tokens) and took 4.54x
# the plain forward there on tiny-llama with the default reducers, the kernel plan 4.47x with the evidence reducers too
AUTO_ANY_PASSES_KEYS = {"cpu": 16384}


def choose_plan(
    wanted: str,
    reads: frozenset[str],
    readers: Callable[[str], list[str]],
    site: str,
    refusal: Callable[[], str | None],
    passes: Callable[[], int],
    device: str,
    keys: int = 0,
) -> str:
    """``"kernel"`` or ``"materialised"`` for one call at ``site`` (module docstring).

    wanted: the observer's ``plan`` option; reads: what its sink reads; readers(quantity): who reads it (for the
    message); refusal(): why the kernel cannot compute this call, or None; passes(): the kernel passes the
    statistics would cost; device: the inputs' device type; keys: the call's key count. Raises UsageError where
    ``kernel`` was asked for and cannot run."""
    if wanted == MATERIALISED:
        return MATERIALISED
    missing = sorted(reads - KERNEL_QUANTITIES)
    if wanted == KERNEL:
        if missing:
            who = ", ".join(readers(missing[0])) or "the sink"
            raise UsageError(
                f"{who} reads {missing[0]} at {site}, which the kernel plan does not compute: "
                "capture with plan auto or materialised, or leave that reducer out"
            )
        why = refusal()
        if why is not None:
            raise UsageError(
                f"the kernel plan cannot compute {site} exactly: {why}; capture with plan auto or materialised"
            )
        return KERNEL
    if missing or device not in AUTO_MAX_PASSES or refusal() is not None:
        return MATERIALISED
    if keys >= AUTO_ANY_PASSES_KEYS.get(device, keys + 1):
        return KERNEL
    long = keys >= AUTO_LONG_KEYS.get(device, keys + 1)
    most = AUTO_MAX_PASSES_LONG[device] if long else AUTO_MAX_PASSES[device]
    return KERNEL if passes() <= most else MATERIALISED
