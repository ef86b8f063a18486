"""Checks that only guidance parameters train and the base stays frozen."""

from __future__ import annotations

from typing import Any

import torch


def trainable_guidance(guided: Any) -> list[torch.nn.Parameter]:
    """The guidance parameters to optimize; RuntimeError if there are none or the base would train."""
    params = list(guided.trainable_parameters())
    if not params:
        raise RuntimeError(f"{getattr(guided, 'name', guided)} has no trainable parameters (training-free method?)")
    base_params = list(guided.base.model.parameters())
    thawed = [n for n, p in guided.base.model.named_parameters() if p.requires_grad]
    if thawed:
        raise RuntimeError(f"base parameters would train: {thawed[:3]}...; the base must stay frozen")
    base_ids = {id(p) for p in base_params}
    if any(id(p) in base_ids for p in params):
        raise RuntimeError("a trainable guidance parameter is a base parameter")
    return params


def assert_base_has_no_grad(guided: Any) -> None:
    """RuntimeError when any base parameter received a gradient."""
    for name, p in guided.base.model.named_parameters():
        if p.grad is not None:
            raise RuntimeError(f"base parameter {name} has a gradient; the base must stay frozen")
