"""The headline grid: attention to a role a checkpoint has not got reads n/a, not 0.000."""

from __future__ import annotations

import pandas as pd

from anchorlens.reports.tables import ABSENT_CELL, headline_grid, present_roles


def _row(checkpoint: str, key: str, label: str, mean: float) -> dict:
    return {
        "name": key,
        "label": label,
        "metric": "decomposition",
        "stack": "decoder",
        "checkpoint": checkpoint,
        "query_role": "input",
        "key_role": key,
        "n": 4,
        "mean": mean,
        "ci_lo": max(0.0, mean - 0.01),
        "ci_hi": mean + 0.01,
        "diff": float("nan") if checkpoint == "base" else 0.1,
        "diff_lo": 0.05,
        "diff_hi": 0.15,
        "q_value": 0.01,
        "fixed": "",
    }


def test_absent_roles_read_not_applicable_and_present_ones_keep_their_numbers():
    headline = pd.DataFrame(
        [
            _row("base", "guidance", "input → guidance", 0.0),
            _row("instance", "guidance", "input → guidance", 0.27),
            _row("base", "special", "input → special (sink excluded)", 0.0),
            _row("instance", "special", "input → special (sink excluded)", 0.0),
            _row("base", "scaffold", "input → scaffold (sink excluded)", 0.2),
            _row("instance", "scaffold", "input → scaffold (sink excluded)", 0.1),
        ]
    )
    metrics = pd.DataFrame(
        {
            "checkpoint": ["base", "base", "instance", "instance", "instance"],
            "metric": "role_flow",
            "query_role": ["content", "scaffold", "content", "scaffold", "instance"],
        }
    )
    present = present_roles(metrics)
    assert present == {"base": {"content", "scaffold"}, "instance": {"content", "scaffold", "instance"}}
    grid = headline_grid(headline, ["base", "instance"], present)
    assert grid.loc["input → guidance (decoder)", "base"] == ABSENT_CELL
    assert grid.loc["input → guidance (decoder)", "instance"].startswith("0.270 [0.260, 0.280]; Δ +0.100")
    assert (grid.loc["input → special (sink excluded) (decoder)"] == ABSENT_CELL).all()
    assert grid.loc["input → scaffold (sink excluded) (decoder)", "base"] == "0.200 [0.190, 0.210]"
    plain = headline_grid(headline, ["base", "instance"])  # without roles: the numbers as before
    assert plain.loc["input → guidance (decoder)", "base"] == "0.000 [0.000, 0.010]"


def test_an_empty_cell_says_empty_and_a_mask_fixed_cell_says_the_mask():
    from anchorlens.analyses.derived import EMPTY_REASON
    from anchorlens.reports.tables import FIXED_CELL, fixed_cell

    assert fixed_cell(EMPTY_REASON) == "n/a (empty: no visible key after knockout)"
    assert fixed_cell("fixed by the causal mask: instance queries see only instance keys") == FIXED_CELL
