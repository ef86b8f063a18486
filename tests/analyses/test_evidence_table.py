"""The evidence table gathered chunk by chunk (bounded memory) equals the table of the whole frame."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from anchorlens.analyses import default_reducers, metrics_frame
from anchorlens.analyses.evidence_table import (
    ALL_LAYERS,
    TABLE_COLUMNS,
    EvidenceSummaries,
    evidence_table,
    example_evidence,
)
from anchorlens.capture.collect import stream_statistics
from anchorlens.tasks import bundled_examples, get_task


@pytest.fixture(scope="module")
def frame(tiny_base) -> pd.DataFrame:
    base = tiny_base("tiny-llama")
    task = get_task("rte")
    batch = base.encode([task.template.render(ex) for ex in bundled_examples("rte")[:6]])
    reducers = default_reducers(extra={"value_mass": {}, "sink_battery": {"eps": [0.2, 0.4]}})
    stream_statistics(base, [batch], reducers)
    return metrics_frame(reducers, anchors=("first_token",))


def test_streamed_table_equals_the_table_of_the_whole_frame(frame, tmp_path):
    two = pd.concat([frame.assign(checkpoint="a"), frame.assign(checkpoint="b")], ignore_index=True)
    whole = evidence_table(two, {"a": (), "b": ()}, n_boot=200)
    summaries = EvidenceSummaries(tmp_path, 6, {"a": (), "b": ()})
    for name in ("a", "b"):
        for chunk in (
            frame[frame.example < 2],
            frame[(frame.example >= 2) & (frame.example < 5)],
            frame[frame.example >= 5],
        ):
            summaries.add(name, chunk)
    streamed = summaries.table(["a", "b"], n_boot=200)
    assert list(streamed.columns) == list(TABLE_COLUMNS)
    pd.testing.assert_frame_equal(streamed, whole, check_exact=False, rtol=1e-12)
    assert streamed["layer"].isna().sum() == len(streamed) / (1 + frame["layer"].nunique())
    assert set(streamed.measure) == {
        "weight",
        "norm",
        "sink_rate@0.2",
        "sink_rate@0.4",
        "sink_rate_any@0.2",
        "sink_rate_any@0.4",
    }


def test_all_layers_row_is_the_mean_over_layers_of_each_example(frame):
    rows = example_evidence(frame)
    per = rows[rows.layer != ALL_LAYERS].groupby(["example", "measure", "key"])["value"].mean()
    overall = rows[rows.layer == ALL_LAYERS].set_index(["example", "measure", "key"])["value"]
    np.testing.assert_allclose(overall.sort_index().to_numpy(), per.sort_index().to_numpy(), rtol=1e-12)


def test_no_evidence_reducer_gives_no_rows(frame):
    plain = frame[~frame.metric.str.startswith(("norm_", "sink_"))]
    assert example_evidence(plain).empty
    assert evidence_table(plain.assign(checkpoint="a"), {}).empty
