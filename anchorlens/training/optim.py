"""Optimizers (AdamW, Adafactor) and their state as safetensors tensors + JSON scalars (no pickle)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from anchorlens.errors import UsageError

OPTIMIZERS = ("adamw", "adafactor")
_PREFIX = "optimizer.state."


def make_optimizer(
    name: str, params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """AdamW (torch) or Adafactor (transformers.optimization, fixed ``lr``, no relative step)."""
    params = list(params)
    key = name.strip().lower()
    if key == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if key == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(
            params, lr=lr, weight_decay=weight_decay, scale_parameter=False, relative_step=False, warmup_init=False
        )
    raise UsageError(f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}")


def _jsonable(value: Any) -> Any:
    """Tuples become lists; other scalars pass."""
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def _untuple(value: Any) -> Any:
    """Lists (JSON arrays) become tuples again, as optimizers store betas/eps."""
    if isinstance(value, list):
        return tuple(_untuple(v) for v in value)
    return value


def optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors keyed ``optimizer.state.{param}.{name}``, JSON facts: param_groups and scalar state)."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, entry in sd["state"].items():
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"{_PREFIX}{pid}.{name}"] = value.detach().cpu().clone().contiguous()
            else:
                scalars.setdefault(str(pid), {})[name] = _jsonable(value)
    groups = [{k: (list(v) if k == "params" else _jsonable(v)) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars, "state_ids": [int(p) for p in sd["state"]]}


def load_optimizer_state(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], facts: dict) -> None:
    """Restore a state written by ``optimizer_state`` (tensors go to their parameters' devices)."""
    state: dict[int, dict[str, Any]] = {int(p): {} for p in facts["state_ids"]}
    for key, value in tensors.items():
        if not key.startswith(_PREFIX):
            continue
        pid, name = key[len(_PREFIX) :].split(".", 1)
        state[int(pid)][name] = value
    for pid, entry in facts["scalars"].items():
        state[int(pid)].update({k: _untuple(v) for k, v in entry.items()})
    groups = [{k: (v if k == "params" else _untuple(v)) for k, v in g.items()} for g in facts["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})
