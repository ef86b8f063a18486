"""Property tests: reducer results do not depend on batching, order or shard splits; values stay in range."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anchorlens.analyses import default_reducers
from anchorlens.runtime.codec import pack_state, unpack_state
from anchorlens.runtime.distributed import merged_states
from anchorlens.runtime.shards import Progress
from tests.runtime.helpers import sorted_frame
from tests.runtime.synth import batch_event, feed, make_items

PROPS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
UNIT_METRICS = ("role_flow", "first_token_mass", "entropy", "anchor_content_entropy")


def frames(reducers) -> pd.DataFrame:
    """All reducer frames, concatenated and sorted."""
    return sorted_frame(pd.concat([r.frame() for r in reducers], ignore_index=True))


def assert_same(a: pd.DataFrame, b: pd.DataFrame, atol: float = 1e-6) -> None:
    """Same rows, values equal to ``atol`` (float32 probabilities summed in different batch shapes)."""
    pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"))
    np.testing.assert_allclose(a["value"].to_numpy(), b["value"].to_numpy(), rtol=0, atol=atol)


def batches_of(order: list[int], cuts: list[int]) -> list[list[int]]:
    """Cut ``order`` at the (sorted, deduplicated) positions ``cuts``."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(order)}), len(order)]
    return [order[a:b] for a, b in zip(bounds, bounds[1:])]


scenario = st.tuples(
    st.integers(1, 9),  # examples
    st.integers(0, 2**16),  # data seed
    st.randoms(use_true_random=False),
)


@PROPS
@given(scenario)
def test_batch_size_and_order_do_not_matter(case):
    n, seed, rnd = case
    data = make_items(n, seed)
    reference = default_reducers()
    feed(reference, data, [[i] for i in range(n)])
    order = list(range(n))
    rnd.shuffle(order)
    other = default_reducers()
    feed(other, data, batches_of(order, [rnd.randrange(n + 1) for _ in range(rnd.randrange(4))]))
    assert_same(frames(other), frames(reference))


@PROPS
@given(scenario, st.integers(1, 4))
def test_merging_random_shard_splits_equals_one_pass(case, n_shards):
    n, seed, rnd = case
    data = make_items(n, seed)
    reference = default_reducers()
    feed(reference, data, [list(range(n))])
    owner = [rnd.randrange(n_shards) for _ in range(n)]
    parts = []
    for s in range(n_shards):
        ids = [i for i in range(n) if owner[i] == s]
        part = default_reducers()
        if ids:
            feed(part, data, [ids])
        parts.append([r.state_dict() for r in part])
    rnd.shuffle(parts)
    merged = default_reducers()
    for r, state in zip(merged, merged_states(merged, parts)):
        r.load_state_dict(state)
    assert_same(frames(merged), frames(reference))


@PROPS
@given(scenario)
def test_values_in_unit_range_and_no_nan_with_padded_rows(case):
    n, seed, _ = case
    data = make_items(n, seed)
    reducers = default_reducers(anchor_role=None)
    feed(reducers, data, [list(range(n))])  # NaN in every padding query row
    df = frames(reducers)
    assert not df["value"].isna().any() and not df["count"].isna().any()
    unit = df[df["metric"].isin(UNIT_METRICS)]["value"]
    assert ((unit >= 0) & (unit <= 1 + 1e-6)).all()  # float32 rows may sum to 1 + 1e-7
    empty = {i for i in range(n) if data[("decoder", 0)][i].roles.numel() == 0}
    assert not empty & set(df["example"])


def test_fully_padded_batch_gives_no_rows_and_no_nan():
    data = make_items(6, seed=1, max_len=0)
    reducers = default_reducers()
    feed(reducers, data, [list(range(6))])
    assert frames(reducers).empty
    event = batch_event([data[("decoder", 0)][0]], [0], ("decoder", 0))
    assert event.probs.isnan().all()


@PROPS
@given(st.integers(1, 8), st.integers(0, 2**16))
def test_states_round_trip_exactly_through_bytes(n, seed):
    data = make_items(n, seed)
    reducers = default_reducers()
    feed(reducers, data, [list(range(n))])
    want = frames(reducers)
    back = default_reducers()
    for r, state in zip(back, unpack_state(pack_state([r.state_dict() for r in reducers]))):
        r.load_state_dict(state)
    pd.testing.assert_frame_equal(frames(back), want, check_exact=True)


def test_progress_shard_round_trip(tmp_path):
    """A chunk's metric rows go to disk and come back bit for bit, with the one schema every shard shares."""
    import pyarrow.parquet as pq

    from anchorlens.analyses import metrics_frame
    from anchorlens.runtime.shards import concat_shards

    data = make_items(5, seed=9)
    reducers = default_reducers()
    feed(reducers, data, [[0, 1, 2], [3, 4]])
    frame = metrics_frame(reducers)
    store = Progress(tmp_path, "k1")
    store.start({"note": "test"})
    assert store.save(7, [0, 1, 2, 3, 4], frame) == len(frame)
    assert store.done(7, [0, 1, 2, 3, 4]) and not store.done(7, [0, 1]) and not store.done(8, [0])
    assert not Progress(tmp_path, "k2").done(7, [0, 1, 2, 3, 4])
    assert Progress.stored_key(tmp_path) == "k1" and store.finished() == [7]
    store.save(8, [5], frame.iloc[:0])  # an empty chunk keeps the schema
    assert store.read(8).schema == store.read(7).schema and store.read(8).num_rows == 0
    out = tmp_path / "metrics.parquet"
    assert concat_shards(store, [(7, [0, 1, 2, 3, 4]), (8, [5])], out) == len(frame)
    back = pd.read_parquet(out)
    pd.testing.assert_frame_equal(back, frame.astype({"head": "Int64"}), check_exact=True, check_dtype=False)
    assert pq.ParquetFile(out).num_row_groups == 2
    assert not list(store.dir.glob("*.tmp-*"))


def test_codec_keeps_dtypes_shapes_and_plain_values():
    state = {
        "a": torch.arange(6, dtype=torch.int32).view(2, 3),
        "b": [torch.zeros(0, 4), None, 1.5, "x"],
        "c": (torch.tensor([True, False]), torch.tensor(2.0, dtype=torch.bfloat16)),
    }
    back = unpack_state(torch.cat([pack_state(state), torch.zeros(5, dtype=torch.uint8)]))
    assert torch.equal(back["a"], state["a"]) and back["a"].dtype == torch.int32
    assert back["b"][0].shape == (0, 4) and back["b"][1:] == [None, 1.5, "x"]
    assert isinstance(back["c"], tuple) and torch.equal(back["c"][0], state["c"][0])
    assert back["c"][1].dtype == torch.bfloat16 and back["c"][1].item() == 2.0
