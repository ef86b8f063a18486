"""Issue 39: numbers under a knockout. Entropy normalises by the keys a query can attend to after the knockout, a
fully masked query row is never averaged in (role_flow rows sum to 1, empty rows are NaN and flagged), mask-fixed
role_flow cells are flagged, and massive activations have input-only rows. References: an eager forward written out
here (HF's attention inputs, the knocked-out keys removed and the softmax renormalised by hand)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.modeling_utils import AttentionInterface

import anchorlens.analyses as A
from anchorlens.analyses.derived import EMPTY_REASON, MASK_REASON
from anchorlens.analyses.entropy import EntropyReducer
from anchorlens.analyses.role_flow import RoleFlowReducer
from anchorlens.capture.run import capture_batch
from anchorlens.methods import load_guided
from tests.methods.helpers import logits_with_attention, rte_batch

REFERENCE = "issue39_reference"
_PLAN: dict = {"mask": None, "layers": (), "probs": {}}


def _reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention written out; at the planned layers the knocked-out keys are removed before the softmax (the
    row renormalised over the rest by hand: exp / sum of exp over the keys left). Keeps probs and visibility."""
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1).double()
    v = value.repeat_interleave(groups, dim=1).double()
    scores = query.double() @ k.transpose(-1, -2) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    visible = (attention_mask[..., : k.shape[2]] > torch.finfo(attention_mask.dtype).min / 2).expand_as(scores)
    if module.layer_idx in _PLAN["layers"]:
        visible = visible & ~_PLAN["mask"]
    weights = torch.where(visible, (scores - scores.amax(-1, keepdim=True)).exp(), 0.0)
    total = weights.sum(-1, keepdim=True)
    probs = torch.where(total > 0, weights / total.clamp_min(1e-300), 0.0)
    _PLAN["probs"][module.layer_idx] = (probs, visible)
    out = (probs @ v).to(value.dtype)
    return out.transpose(1, 2).contiguous(), probs.to(value.dtype)


AttentionInterface.register(REFERENCE, _reference_attention)
AttentionMaskInterface.register(REFERENCE, eager_mask)


class _Reduce:
    """Sink feeding every event to reducers (and keeping the layout of the first)."""

    def __init__(self, reducers) -> None:
        self.reducers = reducers
        self.layout = None

    def consume(self, event) -> None:
        self.layout = self.layout or event.layout
        for r in self.reducers:
            r.update(event)


def _run(base, spec: str, knocked_layers: tuple[int, ...]):
    """(reducers' metrics frame, reference probs by layer, layout) of ``spec`` on a padded RTE batch."""
    from anchorlens.analyses.decomposition import DecompositionReducer

    batch = rte_batch(base, "right")
    model = load_guided(spec, base)
    sink = _Reduce([RoleFlowReducer(), EntropyReducer(), DecompositionReducer()])
    capture_batch(model, batch, sink)
    frame = A.metrics_frame(sink.reducers, anchors=("instance",))
    plain = load_guided("instance", base)
    t = batch.input_ids.shape[1] + 1
    keys = torch.zeros(batch.batch_size, 1, t, t, dtype=torch.bool)
    keys[..., 0] = True  # the instance key: index 0 with right padding
    _PLAN.update(mask=keys, layers=knocked_layers, probs={})
    logits_with_attention(plain, batch, REFERENCE)
    return frame, dict(_PLAN["probs"]), sink.layout


def _reference_rows(probs: torch.Tensor, visible: torch.Tensor, layout) -> dict:
    """Per (example, head, query role): mean normalised entropy and mean mass on each key role over the valid
    queries that see a key (empty rows left out), and how many valid queries the role has."""
    q_roles, q_valid = layout.q.roles, layout.q.valid.bool()
    k_roles, k_valid = layout.k.roles, layout.k.valid.bool()
    seen = visible & k_valid[:, None, None, :]
    n = seen.sum(-1)  # [B, H, Q] keys each query can attend to
    p = probs * k_valid[:, None, None, :]
    plogp = torch.where(p > 0, p * p.clamp_min(1e-300).log(), 0.0).sum(-1)
    mass = p.sum(-1)
    h = (mass.clamp_min(1e-300).log() - plogp / mass.clamp_min(1e-300)) / torch.where(n >= 2, n, 2).log()
    h = torch.where((n >= 2) & (mass > 0), h, 0.0)
    out = {}
    b, heads = probs.shape[:2]
    for e in range(b):
        for head in range(heads):
            for role in q_roles[e][q_valid[e]].unique().tolist():
                rows = q_valid[e] & (q_roles[e] == role)
                live = rows & (n[e, head] > 0)
                flow = {
                    r: float(p[e, head][live][:, k_roles[e] == r].sum(-1).mean()) if live.any() else math.nan
                    for r in k_roles[e][k_valid[e]].unique().tolist()
                }
                ent = float(h[e, head][live].mean()) if live.any() else math.nan
                out[e, head, role] = (ent, flow, int(rows.sum()))
    return out


def _cell(frame, metric, layer, example, head, query_role, key_role=""):
    rows = frame[
        (frame["metric"] == metric)
        & (frame["layer"] == layer)
        & (frame["example"] == example)
        & (frame["head"] == head)
        & (frame["query_role"] == query_role)
        & (frame["key_role"] == key_role)
    ]
    assert len(rows) == 1, (metric, layer, example, head, query_role, key_role, len(rows))
    return rows.iloc[0]


@pytest.mark.parametrize("mode_layers", [(0, 1), (1,)])
def test_entropy_and_role_flow_equal_an_eager_knockout_by_hand(tiny_base, mode_layers):
    """renorm knockout of the instance key: entropy normalised by log(#keys left), empty rows not averaged in."""
    spec = f"instance+knockout:keys=instance,layers={'/'.join(map(str, mode_layers))},mode=renorm"
    frame, reference, layout = _run(tiny_base("tiny-llama"), spec, mode_layers)
    names = layout.k.table.names
    checked_empty = 0
    for layer, (probs, visible) in reference.items():
        for (e, head, role), (ent, flow, _n_queries) in _reference_rows(probs, visible, layout).items():
            label = names[role]
            got = _cell(frame, "entropy", layer, e, head, label)
            if math.isnan(ent):  # every query of the role is empty: NaN, flagged, count 0
                assert np.isnan(got["value"]) and got["fixed"] == EMPTY_REASON and got["count"] == 0
                checked_empty += 1
            elif got["fixed"] == "":
                assert got["value"] == pytest.approx(ent, abs=2e-6), (layer, e, head, label)
            for key_role, want in flow.items():
                cell = _cell(frame, "role_flow", layer, e, head, label, names[key_role])
                if math.isnan(want):
                    assert np.isnan(cell["value"]) and cell["fixed"] == EMPTY_REASON
                elif cell["fixed"] == "":
                    assert cell["value"] == pytest.approx(want, abs=2e-6)
                else:  # fixed by the causal mask: the value the mask decides is 0 or 1, shown as n/a
                    assert cell["fixed"].startswith(MASK_REASON) and np.isnan(cell["value"])
                    assert want in (pytest.approx(0.0, abs=1e-6), pytest.approx(1.0, abs=1e-6))
    # the instance token (position 0) sees only itself: knocked out, its row is empty at every knocked layer
    assert checked_empty > 0


def test_role_flow_rows_sum_to_one_and_mask_fixed_cells_are_flagged(tiny_base):
    frame, _, _ = _run(tiny_base("tiny-llama"), "instance+knockout:keys=instance,layers=1,mode=renorm", (1,))
    flow = frame[(frame["metric"] == "role_flow") & frame["head"].notna()]
    measured = flow[flow["count"] > 0]
    assert not measured.empty
    # instance queries at layer 1 are empty (knocked out); at layer 0 instance -> instance is fixed (1 by the mask)
    inst1 = flow[(flow["layer"] == 1) & (flow["query_role"] == "instance")]
    assert len(inst1) and inst1["value"].isna().all() and (inst1["fixed"] == EMPTY_REASON).all()
    inst0 = flow[(flow["layer"] == 0) & (flow["query_role"] == "instance") & (flow["key_role"] == "instance")]
    assert len(inst0) and inst0["value"].isna().all() and inst0["fixed"].str.startswith(MASK_REASON).all()
    # rows sum to 1: measured cells plus what the mask fixes (0 where it hides a role, 1 where it shows only one)
    for _, row in measured.groupby(["example", "layer", "head", "query_role"]):
        fixed_one = row["fixed"].str.contains("see only").sum()
        assert row["value"].fillna(0.0).sum() + fixed_one == pytest.approx(1.0, abs=1e-5)


def test_a_knockout_that_gives_back_the_base_has_the_base_entropy(tiny_base):
    """instance at position 0 knocked out at every layer (renorm) is the base, shifted by one position: the input
    queries' entropy equals the base's (before: it was normalised by one key too many)."""
    base = tiny_base("tiny-llama")
    from anchorlens.capture.collect import encode_batches, stream_statistics
    from anchorlens.workflows.inputs import resolve_inputs
    from anchorlens.workflows.statistics import model_reducers

    inputs = resolve_inputs("rte", None, 2)
    out = {}
    for spec in ("base", "instance+knockout:keys=instance,mode=renorm"):
        model = load_guided(spec, base)
        prompts = inputs.prompts(model.base.tokenizer, None)
        reducers = model_reducers(model, prompts.roles)
        stream_statistics(model, encode_batches(model, inputs.examples, prompts, batch_size=2), reducers)
        df = A.metrics_frame(reducers, anchors=model.anchors())
        out[spec] = df[(df["metric"] == "entropy") & (df["query_role"] == "input") & df["head"].notna()]
    base_rows, knocked = (out[s].set_index(["example", "layer", "head"])["value"].sort_index() for s in out)
    assert len(base_rows) == len(knocked) > 0
    assert np.allclose(knocked.to_numpy(), base_rows.to_numpy(), atol=1e-5), (knocked - base_rows).abs().max()


def test_massive_activations_report_input_positions_apart():
    """The input rows leave out the inserted instance position: their median and count equal a hand computation
    over the input positions of the residual stream."""
    from anchorlens.analyses.massive import COUNT, MEDIAN, MassiveActivationsReducer
    from anchorlens.capture.event import HiddenEvent
    from anchorlens.roles.layout import SequenceRoles
    from anchorlens.roles.table import BUILTIN_ROLES

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 6, 8, generator=g)
    hidden[:, 0, 3] = 5000.0  # the inserted position's own massive entry
    hidden[1, 4, 2] = 4000.0  # an input one
    roles = torch.tensor([[4, 0, 1, 2, 2, 2], [4, 0, 1, 2, 2, 1]])  # 4: instance
    valid = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    reducer = MassiveActivationsReducer(abs_threshold=100.0, ratio=100.0)
    reducer.update_hidden(
        HiddenEvent("decoder", 0, hidden, SequenceRoles(roles, valid, BUILTIN_ROLES), torch.arange(2))
    )
    frame = reducer.frame()
    for e in range(2):
        rows = frame[frame["example"] == e]
        inputs = valid[e] & (roles[e] != 4)
        mag = hidden[e][inputs].abs()
        median = float(mag.flatten().median())
        want = int(((mag > 100.0) & (mag > 100.0 * median)).sum())
        got = rows[(rows["metric"] == COUNT) & (rows["query_role"] == "input")]["value"].item()
        assert got == want
        assert rows[(rows["metric"] == MEDIAN) & (rows["query_role"] == "input")]["value"].item() == pytest.approx(
            median
        )
        everything = rows[(rows["metric"] == COUNT) & (rows["query_role"] == "all")]["value"].item()
        assert everything == want + 1  # the all-positions count holds the inserted position's entry
