"""Fields are roles too: the content tokens of each template field form a group ``content:<field>``, reported beside
the roles (a finer partition of ``content``), checked against HF eager attention and a hand-written loop."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from anchorlens.analyses import average_heads, default_reducers, metrics_frame
from anchorlens.analyses.derived import FIELD_FLOW
from anchorlens.analyses.flow import flow_by_layer
from anchorlens.analyses.frames import input_labels_among
from anchorlens.analyses.headline import field_metrics, run_headline
from anchorlens.analyses.registry import make_reducer
from anchorlens.capture.certificate import eager_reference
from anchorlens.capture.collect import encode_batches, stream_statistics
from anchorlens.roles.kinds import Role
from anchorlens.roles.layout import SequenceRoles
from anchorlens.roles.table import RoleTable, field_group, is_field_group
from anchorlens.tasks import bundled_examples, get_task
from anchorlens.tasks.prompts import build_prompts

PREMISE, HYPOTHESIS = field_group("premise"), field_group("hypothesis")


@pytest.fixture(scope="module")
def rte_run(tiny_base):
    """Four rte examples through tiny-llama: the prompts, the batches and the metric frame of the default reducers."""
    base = tiny_base("tiny-llama")
    prompts = build_prompts(get_task("rte"), base.tokenizer)
    examples = bundled_examples("rte")[:4]
    batches = list(encode_batches(base, examples, prompts, batch_size=2))
    reducers = stream_statistics(base, batches, default_reducers(roles=prompts.roles))
    return base, prompts, batches, metrics_frame(reducers, anchors=())


def _flow(frame: pd.DataFrame) -> pd.DataFrame:
    """Per-head role_flow rows indexed by site and (query, key) label."""
    flow = frame[frame["metric"] == "role_flow"].astype({"query_role": str, "key_role": str})
    return flow.set_index(["example", "layer", "head", "query_role", "key_role"])


def test_the_task_table_names_the_template_fields(rte_run):
    _, prompts, batches, _ = rte_run
    table = prompts.roles
    assert table.fields == ("premise", "hypothesis")
    assert table.group_names == (PREMISE, HYPOTHESIS)
    assert RoleTable.from_json(table.to_json()) == table
    assert "fields" not in RoleTable().to_json()  # a run without fields writes the manifest it always wrote
    ids = batches[0].field_ids()
    content = batches[0].roles == int(Role.CONTENT)
    assert ((ids >= 0) == content).all()  # every rte content token comes from one of the two fields
    for b, row in enumerate(batches[0].fields):
        for t, name in enumerate(row):
            want = table.field_id(name) if content[b, t] else -1
            assert int(ids[b, t]) == want


def test_field_groups_equal_hf_eager_attention(rte_run):
    """content:hypothesis -> content:premise (and every other group pair) from HF eager output_attentions, summed
    by hand over the tokens whose Encoded.fields name the field."""
    base, prompts, batches, frame = rte_run
    flow = _flow(frame)
    checked = 0
    for batch in batches:
        reference = eager_reference(base, batch)["decoder"]
        for b in range(batch.batch_size):
            example = int(batch.example_ids[b])
            valid = batch.attention_mask[b].bool()
            content = (batch.roles[b] == int(Role.CONTENT)) & valid
            members = {
                field_group(f): torch.tensor([bool(content[t]) and batch.fields[b][t] == f for t in range(len(valid))])
                for f in prompts.roles.fields
            }
            members["content"] = content
            for layer, probs in reference.items():
                p = probs[b].double()  # [H, Q, K]
                for q_label in (PREMISE, HYPOTHESIS, "content"):
                    for k_label in (PREMISE, HYPOTHESIS, "content"):
                        mass = p[:, members[q_label]][:, :, members[k_label]].sum(-1).mean(-1)  # [H]
                        for head in range(p.shape[0]):
                            got = flow.loc[(example, layer, head, q_label, k_label)]
                            if got["fixed"]:
                                assert float(mass[head]) == 0.0  # premise queries never see hypothesis keys
                                continue
                            assert got["value"] == pytest.approx(float(mass[head]), abs=1e-6)
                            assert got["count"] == int(members[q_label].sum())
                            checked += 1
    assert checked > 100


def test_field_groups_sum_to_content_on_both_sides(rte_run):
    """Exactness: the field groups' key masses sum to the content mass (every query group), and their queries'
    mass sums (value x count) to the content queries' (every key group), within 1e-6."""
    _, _, _, frame = rte_run
    flow = frame[frame["metric"] == "role_flow"].astype({"query_role": str, "key_role": str})
    flow = flow.assign(value=flow["value"].fillna(0.0))  # fixed cells: no mass (premise sees no hypothesis)
    wide = flow.pivot_table(index=["example", "layer", "head", "query_role"], columns="key_role", values="value")
    assert np.allclose(wide[PREMISE] + wide[HYPOTHESIS], wide["content"], atol=1e-6, rtol=0)
    mass = flow.assign(m=flow["value"] * flow["count"]).pivot_table(
        index=["example", "layer", "head", "key_role"], columns="query_role", values="m"
    )
    counts = flow.pivot_table(index=["example", "layer", "head", "key_role"], columns="query_role", values="count")
    assert (counts[PREMISE] + counts[HYPOTHESIS] == counts["content"]).all()
    # the content queries' mean mass is the field groups' pooled by their query counts (sums over queries run in
    # float32, so the total masses of ~50 queries agree to ~1e-5 and their means to ~1e-7)
    pooled = (mass[PREMISE] + mass[HYPOTHESIS]) / counts["content"]
    assert np.allclose(pooled, mass["content"] / counts["content"], atol=1e-6, rtol=0)


def test_content_totals_do_not_change(rte_run, tiny_base):
    """The same run without field groups gives the very same rows for every role (the groups are added, nothing
    else moves): role_flow, the derived metrics and the decomposition."""
    base, prompts, batches, frame = rte_run
    plain = RoleTable(prompts.roles.names, prompts.roles.descriptions)  # the same roles, no fields
    assert not plain.fields
    plain_batches = [_without_fields(b, plain) for b in batches]
    reducers = stream_statistics(base, plain_batches, default_reducers(roles=plain))
    before = metrics_frame(reducers, anchors=())
    after = frame[~frame["query_role"].astype(str).map(is_field_group)]
    after = after[~after["key_role"].astype(str).map(is_field_group) & (after["metric"] != FIELD_FLOW)]
    keys = ["metric", "example", "stack", "layer", "head", "query_role", "key_role"]
    a = after.astype({"query_role": str, "key_role": str, "metric": str}).sort_values(keys).reset_index(drop=True)
    b = before.astype({"query_role": str, "key_role": str, "metric": str}).sort_values(keys).reset_index(drop=True)
    assert len(a) == len(b)
    pd.testing.assert_frame_equal(a[keys + ["count", "fixed"]], b[keys + ["count", "fixed"]])
    assert np.allclose(a["value"], b["value"], atol=1e-9, rtol=0, equal_nan=True)


def _without_fields(batch, table):
    from dataclasses import replace

    return replace(batch, role_table=table)


def test_the_mask_fixes_field_pairs_and_input_pools_leave_groups_out(rte_run):
    _, _, _, frame = rte_run
    flow = _flow(frame)
    fixed = flow.xs((PREMISE, HYPOTHESIS), level=("query_role", "key_role"))
    assert fixed["value"].isna().all() and fixed["fixed"].str.startswith("fixed by the causal mask").all()
    measured = flow.xs((HYPOTHESIS, PREMISE), level=("query_role", "key_role"))
    assert (measured["fixed"] == "").all() and (measured["value"] > 0).all()
    assert input_labels_among(["special", "content", PREMISE, "structural"]) == ("special", "structural", "content")
    # the pooled rows count content once: input -> structural equals the pool over the roles only
    field_flow = frame[frame["metric"] == FIELD_FLOW]
    assert (
        len(field_flow)
        and (
            field_flow["query_role"].astype(str).map(is_field_group)
            | field_flow["key_role"].astype(str).map(is_field_group)
        ).all()
    )
    both = field_flow.set_index(["example", "layer", "head", "query_role", "key_role"])["value"]
    assert np.allclose(both.to_numpy(), flow.loc[both.index, "value"].to_numpy(), equal_nan=True)


def test_flow_table_and_headline_show_the_fields(rte_run):
    _, prompts, _, frame = rte_run
    table = flow_by_layer(frame, HYPOTHESIS, roles=prompts.roles.names)
    assert list(table.columns[-2:]) == [PREMISE, HYPOTHESIS]
    roles = [c for c in table.columns if not is_field_group(c)]
    assert np.allclose(table[roles].sum(axis=1), 1.0, atol=1e-6)
    assert np.allclose(table[PREMISE] + table[HYPOTHESIS], table["content"], atol=1e-6)
    # input queries pool the roles only: the same table as a frame without any field-group row, plus the groups
    inputs = flow_by_layer(frame, "input", roles=prompts.roles.names)
    grouped = frame["query_role"].astype(str).map(is_field_group) | frame["key_role"].astype(str).map(is_field_group)
    plain = flow_by_layer(frame[~grouped], "input", roles=prompts.roles.names)
    pd.testing.assert_frame_equal(inputs[list(plain.columns)], plain)
    assert np.allclose(inputs[PREMISE] + inputs[HYPOTHESIS], inputs["content"], atol=1e-6)
    names = [m.name for m in field_metrics(prompts.roles.fields)]
    assert names == ["field_flow:hypothesis:premise", "field_flow:premise:hypothesis"]
    headline = run_headline((), prompts.roles.fields)
    assert [m.name for m in headline[-2:]] == names and run_headline(()) == headline[:-2]
    rows = headline[-2].rows(frame)
    assert len(rows) and (rows["metric"] == FIELD_FLOW).all()


def test_role_flow_state_with_fields_round_trips_and_refuses_another_table():
    table = RoleTable().with_fields(["premise", "hypothesis"])
    reducer = make_reducer("role_flow", roles=table)
    assert reducer.state_options()["fields"] == ["premise", "hypothesis"]
    assert "fields" not in make_reducer("role_flow").state_options()  # old states still load
    other = make_reducer("role_flow", roles=RoleTable())
    with pytest.raises(ValueError):
        reducer.merge(other)


def test_inserted_and_sliced_positions_keep_their_field_groups():
    roles = torch.tensor([[0, 1, 2, 2, 1, 2]])
    fields = torch.tensor([[-1, -1, 0, 0, -1, 1]])
    seq = SequenceRoles(roles, torch.ones_like(roles, dtype=torch.bool), RoleTable().with_fields(["a", "b"]), fields)
    grown = seq.insert(torch.tensor([2]), int(Role.INSTANCE), 2)
    assert grown.roles.tolist() == [[0, 1, 4, 4, 2, 2, 1, 2]]
    assert grown.fields is not None and grown.fields.tolist() == [[-1, -1, -1, -1, 0, 0, -1, 1]]
    part = grown.slice(3, 6)
    assert part.fields is not None and part.fields.tolist() == [[-1, 0, 0]] and part.roles.tolist() == [[4, 2, 2]]


def test_a_guided_model_keeps_the_field_groups(rte_run, tiny_base):
    """An instance token inserted into the sequence: the groups keep their tokens (counts as the template's)."""
    from anchorlens.methods.spec import load_guided

    base, prompts, batches, frame = rte_run
    model = load_guided("instance", base=base)
    reducers = stream_statistics(model, batches[:1], [make_reducer("role_flow", roles=prompts.roles)])
    guided = _flow(metrics_frame(reducers, anchors=()))
    plain = _flow(frame)
    for label in (PREMISE, HYPOTHESIS):
        got = guided.xs((label, "instance"), level=("query_role", "key_role"))["count"]
        want = plain.xs((label, "content"), level=("query_role", "key_role"))["count"].loc[got.index]
        assert (got.to_numpy() == want.to_numpy()).all() and len(got)
        sums = guided.xs(label, level="query_role")["value"].unstack("key_role").fillna(0.0)
        assert np.allclose(sums[PREMISE] + sums[HYPOTHESIS], sums["content"], atol=1e-6)
    assert not math.isnan(float(guided.xs((HYPOTHESIS, PREMISE), level=("query_role", "key_role"))["value"].mean()))


def test_query_chunks_keep_the_field_groups(rte_run):
    """A tiny memory budget splits every attention call into chunks of a few queries: the same rows."""
    from anchorlens.capture.options import CaptureOptions

    base, prompts, batches, frame = rte_run
    reducers = [make_reducer("role_flow", roles=prompts.roles)]
    chunked = _flow(
        metrics_frame(stream_statistics(base, batches, reducers, options=CaptureOptions(memory_budget=4096)))
    )
    whole = _flow(frame).loc[chunked.index]
    assert chunked.index.get_level_values("query_role").isin([PREMISE, HYPOTHESIS]).any()
    assert (chunked["count"].to_numpy() == whole["count"].to_numpy()).all()
    measured = (whole["fixed"] == "").to_numpy()  # (no visibility rows here: nothing is flagged in ``chunked``)
    assert np.allclose(chunked["value"][measured], whole["value"][measured], atol=1e-6, equal_nan=True)


def test_the_role_flow_figure_draws_the_field_groups_after_the_roles(rte_run):
    import matplotlib.pyplot as plt

    from anchorlens.figures import role_flow_heatmaps

    _, _, _, frame = rte_run
    fig = role_flow_heatmaps(average_heads(frame).assign(checkpoint="base"))
    try:
        ax = fig.axes[0]
        columns = [t.get_text() for t in ax.get_xticklabels()]
        rows = [t.get_text() for t in ax.get_yticklabels()]
        assert columns[-2:] == [PREMISE, HYPOTHESIS] and rows[-2:] == [PREMISE, HYPOTHESIS]
        assert not any(is_field_group(c) for c in columns[:-2])
        lines = [ln for ln in ax.lines if ln.get_gid() == "field-groups"]
        assert len(lines) == 2  # one before the first field-group row, one before the first column
        content = next(t for t in ax.get_xticklabels() if t.get_text() == "content").get_color()
        assert all(t.get_color() == content for t in ax.get_xticklabels() if is_field_group(t.get_text()))
        # the premise -> hypothesis cell is n/a, with the mask's reason in the title
        assert "content:premise queries see no content:hypothesis key" in fig.texts[0].get_text() or any(
            "content:premise queries see no content:hypothesis" in t.get_text() for t in fig.texts
        )
    finally:
        plt.close(fig)


def test_inspect_shows_the_field_groups(tiny_base):
    from anchorlens.notebook.inspect import inspect

    example = bundled_examples("rte")[0]
    result = inspect("base", example, base=tiny_base("tiny-llama"), task="rte")
    assert f"field groups (parts of content): {PREMISE}, {HYPOTHESIS}" in result.summary()
    table = result.field_flow()
    assert list(table.index) == [PREMISE, HYPOTHESIS]
    assert list(table.columns[-2:]) == [PREMISE, HYPOTHESIS]
    assert np.isnan(table.loc[PREMISE, HYPOTHESIS])  # fixed by the causal mask
    assert table.loc[HYPOTHESIS, PREMISE] > 0
    assert table.loc[HYPOTHESIS, PREMISE] + table.loc[HYPOTHESIS, HYPOTHESIS] == pytest.approx(
        table.loc[HYPOTHESIS, "content"], abs=1e-6
    )


def test_a_single_field_is_no_group():
    """One field's group would be content itself: a template of one field adds no group (and no rows)."""
    assert RoleTable().with_fields(["text"]).fields == ()
    assert RoleTable().with_fields(["a", "b", "a", ""]).fields == ("a", "b")
    assert RoleTable().extend(["newline"]).with_fields(["a", "b"]).extend(["punct"]).fields == ("a", "b")
