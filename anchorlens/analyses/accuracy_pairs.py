"""Every checkpoint against every other on the same examples: paired accuracy differences.

``compare`` pairs each checkpoint with the first (``task_effects.csv``); a study of several trained methods
also asks whether one beats another (the capsule vs prompt tuning). :func:`accuracy_pairs` gives, for each
unordered pair (a, b) in checkpoint order, both accuracies with Wilson intervals, Δ = b − a with Newcombe's
paired interval, how many examples changed either way, McNemar's exact p and Benjamini-Hochberg q over the
pairs. A pair that no example tells apart reads Δ 0 with no p or q (as everywhere: not a finding).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np
import pandas as pd

from anchorlens.analyses.stats import (
    benjamini_hochberg,
    mcnemar_test,
    newcombe_paired_interval,
    paired_counts,
    wilson_interval,
)

COLUMNS = (
    "a", "b", "n", "accuracy_a", "a_lo", "a_hi", "accuracy_b", "b_lo", "b_hi", "diff", "diff_lo", "diff_hi",
    "only_a_right", "only_b_right", "p_value", "q_value",
)  # fmt: skip


def accuracy_pairs(effect_rows: pd.DataFrame, checkpoints: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per pair (a before b in ``checkpoints`` order) from per-example task effects.

    ``effect_rows``: long rows ``checkpoint, example, metric, value`` (compare's ``effects.parquet``); the
    ``correct`` rows (1.0 right, 0.0 wrong) are used, paired by example (examples one side lacks are left out).
    """
    correct = effect_rows[effect_rows["metric"] == "correct"]
    if correct.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    wide = correct.pivot_table(index="example", columns="checkpoint", values="value", aggfunc="first")
    names = [c for c in (checkpoints or list(dict.fromkeys(correct["checkpoint"]))) if c in wide.columns]
    rows = []
    for a, b in combinations(names, 2):
        pair = wide[[a, b]].dropna()
        ra, rb = pair[a].to_numpy(), pair[b].to_numpy()
        n = len(pair)
        both, only_a, only_b, _ = paired_counts(ra, rb)
        a_lo, a_hi = wilson_interval(both + only_a, n)
        b_lo, b_hi = wilson_interval(both + only_b, n)
        lo, hi = newcombe_paired_interval(rb, ra)  # Δ = b - a
        rows.append(
            {
                "a": a,
                "b": b,
                "n": n,
                "accuracy_a": (both + only_a) / n if n else np.nan,
                "a_lo": a_lo,
                "a_hi": a_hi,
                "accuracy_b": (both + only_b) / n if n else np.nan,
                "b_lo": b_lo,
                "b_hi": b_hi,
                "diff": (only_b - only_a) / n if n else np.nan,
                "diff_lo": lo,
                "diff_hi": hi,
                "only_a_right": only_a,
                "only_b_right": only_b,
                "p_value": mcnemar_test(ra, rb) if only_a + only_b else np.nan,  # no example changed: no test
            }
        )
    table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "q_value"])
    table["q_value"] = benjamini_hochberg(table["p_value"].to_numpy())[1] if len(table) else []
    return table


def pair_lines(table: pd.DataFrame) -> list[str]:
    """Markdown lines: ``b vs a: 0.862 vs 0.780, Δ +0.082 [+0.055, +0.109] (81 vs 9 examples changed) q=…``."""
    lines = []
    for r in table.itertuples():
        if r.only_a_right + r.only_b_right == 0:
            said = f"Δ 0 (no example changed; [{r.diff_lo:+.3f}, {r.diff_hi:+.3f}] Newcombe)"
        else:
            q = f"q={r.q_value:.2g}" if np.isfinite(r.q_value) else ""
            said = (
                f"Δ {r.diff:+.3f} [{r.diff_lo:+.3f}, {r.diff_hi:+.3f}] Newcombe "
                f"({r.only_b_right} examples right only with {r.b}, {r.only_a_right} only with {r.a}) {q}"
            )
        lines.append(f"- {r.b} vs {r.a}: {r.accuracy_b:.3f} vs {r.accuracy_a:.3f} (n={r.n}), {said.strip()}")
    return lines
