"""A compare run's per-example metrics file (``metrics.parquet``, or an older ``metrics.csv``) read back."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from anchorlens.analyses.frames import conform


def read_metrics(path: Path) -> pd.DataFrame:
    """A compare run's metrics file (parquet or csv) as a tidy frame."""
    if path.suffix == ".parquet":
        return conform(pd.read_parquet(path))
    return conform(pd.read_csv(path, keep_default_na=False, na_values={"value": [""], "count": [""], "head": [""]}))
