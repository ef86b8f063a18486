"""Save and load named AttentionMaps as safetensors + a JSON sidecar (no pickle)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file

from anchorlens.capture.maps import AttentionMaps, StackMaps
from anchorlens.roles.kinds import ROLE_NAMES
from anchorlens.tensorfile import save_tensors


def save_maps(maps: Mapping[str, AttentionMaps], stem: str | Path) -> tuple[Path, Path]:
    """Write ``stem.safetensors`` (probs, roles, learned-sink mass where present) and ``stem.json`` (tokens, layers, heads)."""
    stem = Path(stem)
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, dict] = {}
    for i, (name, amap) in enumerate(maps.items()):
        stacks: dict[str, dict] = {}
        entry = {"name": name, "example_id": amap.example_id, "stacks": stacks}
        for stack, sm in amap.stacks.items():
            key = f"{i}/{stack}"
            tensors[f"{key}/probs"] = sm.probs.contiguous()
            tensors[f"{key}/q_roles"] = sm.q_roles.contiguous()
            tensors[f"{key}/k_roles"] = sm.k_roles.contiguous()
            if sm.learned_sink is not None:
                tensors[f"{key}/learned_sink"] = sm.learned_sink.contiguous()
            stacks[stack] = {
                "layers": sm.layers,
                "heads": sm.heads,
                "q_tokens": sm.q_tokens,
                "k_tokens": sm.k_tokens,
                "role_names": list(sm.role_names),
            }
        meta[str(i)] = entry
    st, js = stem.with_suffix(".safetensors"), stem.with_suffix(".json")
    save_tensors(tensors, st)
    js.write_text(json.dumps(meta))
    return st, js


def load_maps(stem: str | Path) -> dict[str, AttentionMaps]:
    """Read maps written by :func:`save_maps`, in their saved order."""
    stem = Path(stem)
    tensors = load_file(str(stem.with_suffix(".safetensors")))
    meta = json.loads(stem.with_suffix(".json").read_text())
    out: dict[str, AttentionMaps] = {}
    for i, entry in sorted(meta.items(), key=lambda kv: int(kv[0])):
        stacks = {}
        for stack, info in entry["stacks"].items():
            key = f"{i}/{stack}"
            stacks[stack] = StackMaps(
                tensors[f"{key}/probs"],
                info["layers"],
                info["heads"],
                tensors[f"{key}/q_roles"],
                tensors[f"{key}/k_roles"],
                info["q_tokens"],
                info["k_tokens"],
                tuple(info.get("role_names", ROLE_NAMES)),  # maps saved before open roles: the built-ins
                tensors.get(f"{key}/learned_sink"),
            )
        out[entry["name"]] = AttentionMaps(entry["example_id"], stacks)
    return out
