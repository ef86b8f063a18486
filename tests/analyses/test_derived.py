"""Derived metrics on integer-coded rows equal the pandas reference, row for row, on real captures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import reference_metrics as ref

import anchorlens.analyses as A
from anchorlens.analyses.frames import concat_frames
from anchorlens.analyses.groups import Groups, combined_key
from anchorlens.analyses.rows import Rows

CASES = [
    ("tiny-llama", "instance"),  # guidance first: island and anchor_structural fixed by the causal mask
    ("tiny-llama", "instance:pos=last"),  # anchor_mass fixed: input queries never see the last token
    ("tiny-llama", "prompt:n=3"),
    ("tiny-qwen2", "capsule"),
    ("tiny-t5", "prompt:n=2"),  # encoder, decoder and cross stacks
    ("tiny-bert", "base"),  # bidirectional, capture only: nothing fixed
]


@pytest.fixture(scope="module")
def captured(tiny_base):
    """{case: (reducers, anchors)} of 3 RTE examples captured with the default reducers (and value mass)."""
    from anchorlens.capture.collect import encode_batches, stream_statistics
    from anchorlens.methods.spec import load_guided
    from anchorlens.workflows.inputs import resolve_inputs
    from anchorlens.workflows.statistics import model_reducers

    inputs = resolve_inputs("rte", None, 3)
    out = {}
    for base, spec in CASES:
        model = load_guided(spec, tiny_base(base))
        prompts = inputs.prompts(model.base.tokenizer, None)
        extra = {} if base == "tiny-bert" else {"value_mass": {}}  # BERT's output is not a per-head projection
        reducers = model_reducers(model, prompts.roles, extra)
        batches = encode_batches(model, inputs.examples, prompts, batch_size=2, example_ids=[4, 1, 7])
        stream_statistics(model, batches, reducers)
        out[(base, spec)] = (reducers, (*model.anchors(), "first_token"))
    return out


def _reference(reducers, anchors) -> pd.DataFrame:
    """metrics_frame as the pandas implementation built it."""
    base = concat_frames(r.frame() for r in reducers)
    return ref.mark_fixed(concat_frames([base, ref.derived_metrics(base, anchors)]))


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_metrics_frame_equals_the_pandas_reference(captured, case):
    reducers, anchors = captured[case]
    got = A.metrics_frame(reducers, anchors=anchors)
    expected = _reference(reducers, anchors)
    pd.testing.assert_frame_equal(got, expected)
    assert len(got) > len(concat_frames(r.frame() for r in reducers))  # derived rows were made
    if case[0] != "tiny-bert":
        assert (got["fixed"] != "").any()  # the causal cases exercise the flags


@pytest.mark.parametrize("case", CASES[:5], ids=["-".join(c) for c in CASES[:5]])
def test_frame_functions_equal_the_pandas_reference(captured, case):
    reducers, _ = captured[case]
    base = concat_frames(r.frame() for r in reducers)
    for got, expected in (
        (
            A.flow_mass(base, ["structural", "content"], ["content", "special"], metric="x"),
            ref.flow_mass(base, ["structural", "content"], ["content", "special"], metric="x"),
        ),
        (A.flow_mass(base, "input", None), ref.flow_mass(base, "input", None)),
        (A.island_score(base), ref.island_score(base)),
        (A.anchor_mass(base, "first_token", "guidance"), ref.anchor_mass(base, "first_token", "guidance")),
        (A.pooled_entropy(base), ref.pooled_entropy(base)),
        (A.guidance_absorption(base), ref.guidance_absorption(base)),
        (A.derived_metrics(base, ["capsule", "instance"]), ref.derived_metrics(base, ["capsule", "instance"])),
    ):
        pd.testing.assert_frame_equal(got.reset_index(drop=True), expected.reset_index(drop=True))


def test_mark_fixed_keeps_extra_columns_and_earlier_reasons(captured):
    reducers, anchors = captured[("tiny-llama", "instance")]
    frame = A.metrics_frame(reducers, anchors=anchors).assign(run="a")
    frame.loc[0, "fixed"] = "kept"
    got = A.mark_fixed(frame)
    expected = ref.mark_fixed(frame)
    pd.testing.assert_frame_equal(got, expected)
    assert got.loc[0, "fixed"] == "kept" and list(got.columns)[-1] == "run"


def test_nan_values_are_skipped_as_pandas_sums_skip_them(captured):
    reducers, _ = captured[("tiny-llama", "prompt:n=3")]
    base = concat_frames(r.frame() for r in reducers)
    base.loc[base.index[::7], "value"] = np.nan
    pd.testing.assert_frame_equal(A.pooled_entropy(base), ref.pooled_entropy(base))
    pd.testing.assert_frame_equal(A.island_score(base), ref.island_score(base))


def test_combined_key_orders_rows_lexicographically():
    rng = np.random.default_rng(0)
    parts = [rng.integers(-3, 40, 500), rng.integers(0, 3, 500), rng.integers(0, 1000, 500)]
    key = combined_key(parts)
    order = np.lexsort(parts[::-1])
    assert (np.diff(key[order]) >= 0).all()
    assert len(np.unique(key)) == len({tuple(p) for p in zip(*parts)})


def test_combined_key_re_ranks_before_overflowing():
    big = np.array([0, 2**40, 5, 2**40, 0], dtype=np.int64)
    key = combined_key([big, big, big, np.array([1, 0, 1, 0, 0])])
    assert key[1] == key[3] and key[0] != key[4] and key[4] < key[0] < key[2] < key[1]


def test_groups_sort_labels_by_text_and_head_means_last():
    frame = pd.DataFrame(
        {
            "example": [1, 1, 0, 1, 1],
            "stack": ["z", "a", "a", "a", "a"],
            "layer": [0, 0, 0, 0, 0],
            "head": pd.array([None, 2, 0, None, 0], dtype="Int64"),
            "metric": ["m"] * 5,
            "query_role": ["q"] * 5,
            "key_role": [""] * 5,
            "value": [1.0, 2.0, 3.0, 4.0, 5.0],
            "count": [1.0] * 5,
        }
    )
    groups = Groups.of(Rows.from_frame(frame), ("example", "stack", "layer", "head"))
    # (0,a,0,h0) < (1,a,0,h0) < (1,a,0,h2) < (1,a,0,<NA>) < (1,z,0,<NA>): as a sorted pandas group-by
    assert groups.first.tolist() == [2, 4, 1, 3, 0]
    assert groups.sum(frame["value"].to_numpy()).tolist() == [3.0, 5.0, 2.0, 4.0, 1.0]
    expected = frame.groupby(["example", "stack", "layer", "head"], sort=True, dropna=False)["value"].sum()
    assert groups.sum(frame["value"].to_numpy()).tolist() == expected.tolist()
