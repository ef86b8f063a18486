"""Synthetic attention events for the analyses tests."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from anchorlens.capture.event import AttentionEvent
from anchorlens.roles.kinds import Role
from anchorlens.roles.layout import Layout, SequenceRoles


def make_event(
    probs: torch.Tensor,
    roles: torch.Tensor,
    valid: torch.Tensor | None = None,
    *,
    visible: torch.Tensor | None = None,
    example_ids=None,
    heads=None,
    stack: str = "decoder",
    layer: int = 0,
) -> AttentionEvent:
    """Self-attention event from explicit probs [B, H, T, T] and roles [B, T]."""
    b, h, t, _ = probs.shape
    valid = torch.ones(b, t, dtype=torch.bool) if valid is None else valid.bool()
    if visible is None:
        visible = (probs > 0).any(1, keepdim=True) | valid[:, None, None, :]
    seq = SequenceRoles(roles.long(), valid)
    return AttentionEvent(
        stack=stack,
        layer=layer,
        heads=torch.arange(h) if heads is None else torch.as_tensor(heads),
        probs=probs.float(),
        visible=visible.bool(),
        layout=Layout.self_attention(seq),
        example_ids=torch.arange(b) if example_ids is None else torch.as_tensor(example_ids),
    )


def random_event(
    seed: int,
    b: int = 3,
    h: int = 2,
    t: int = 7,
    *,
    left_pad: bool = True,
    causal: bool = True,
    example_ids=None,
    stack: str = "decoder",
    layer: int = 0,
    heads=None,
    scale: float = 3.0,
    nan_padding: bool = False,
    lengths=None,
) -> AttentionEvent:
    """Random softmax rows over visible keys (causal & valid keys), random roles, padded lengths.

    Padding queries get garbage rows (random, or NaN with ``nan_padding``) that reducers must ignore;
    a query with no visible key has an all-zero row.
    """
    g = torch.Generator().manual_seed(seed)
    if lengths is None:
        lengths = torch.randint(0, t + 1, (b,), generator=g)
    lengths = torch.as_tensor(lengths)
    pos = torch.arange(t)
    if left_pad:
        valid = pos[None, :] >= (t - lengths)[:, None]
    else:
        valid = pos[None, :] < lengths[:, None]
    roles = torch.randint(0, 6, (b, t), generator=g)
    roles = torch.where(valid, roles, torch.zeros_like(roles))
    visible = valid[:, None, None, :].expand(b, 1, t, t)
    if causal:
        visible = visible & torch.ones(t, t, dtype=torch.bool).tril()
    logits = torch.randn(b, h, t, t, generator=g) * scale
    logits = logits.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(logits, -1).nan_to_num(0.0)
    garbage = torch.full_like(probs, float("nan")) if nan_padding else torch.rand(b, h, t, t, generator=g)
    probs = torch.where(valid[:, None, :, None], probs, garbage)
    return AttentionEvent(
        stack=stack,
        layer=layer,
        heads=torch.arange(h) if heads is None else torch.as_tensor(heads),
        probs=probs,
        visible=visible,
        layout=Layout.self_attention(SequenceRoles(roles, valid)),
        example_ids=torch.arange(b) if example_ids is None else torch.as_tensor(example_ids),
    )


def split_event(event: AttentionEvent, index) -> AttentionEvent:
    """The sub-batch ``index`` (list of batch rows) of an event."""
    idx = torch.as_tensor(index, dtype=torch.long)
    vis = event.visible if event.visible.shape[0] == 1 else event.visible[idx]
    q = SequenceRoles(event.layout.q.roles[idx], event.layout.q.valid[idx])
    k = SequenceRoles(event.layout.k.roles[idx], event.layout.k.valid[idx])
    return AttentionEvent(
        event.stack, event.layer, event.heads, event.probs[idx], vis, Layout(q, k), event.example_ids[idx]
    )


NAN = float("nan")
CAP, STR, CON, SOFT, SPE = Role.CAPSULE, Role.STRUCTURAL, Role.CONTENT, Role.SOFT_PROMPT, Role.SPECIAL


def hand_event() -> AttentionEvent:
    """Two examples (ids 10, 11), one head (model index 5); example 11 is left-padded by one."""
    probs = torch.tensor(
        [
            [[1, 0, 0, 0], [0.6, 0.4, 0, 0], [0.5, 0.2, 0.3, 0], [0.1, 0.2, 0.3, 0.4]],
            [[NAN, NAN, NAN, NAN], [0, 1, 0, 0], [0, 0.4, 0.6, 0], [0, 0.2, 0.3, 0.5]],
        ]
    ).unsqueeze(1)
    roles = torch.tensor([[CAP, STR, CON, CON], [SPE, STR, SOFT, CAP]])
    valid = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]).bool()
    visible = valid[:, None, None, :] & torch.ones(4, 4, dtype=torch.bool).tril()
    return make_event(probs, roles, valid, visible=visible, example_ids=[10, 11], heads=[5])


def lookup(df: pd.DataFrame, **kw) -> float:
    """The single value of the row matching ``kw``."""
    mask = np.ones(len(df), dtype=bool)
    for k, v in kw.items():
        mask &= (df[k] == v).to_numpy()
    rows = df[mask]
    assert len(rows) == 1, (kw, rows)
    return float(rows["value"].iloc[0])
