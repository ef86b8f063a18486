"""Import PEFT prompt-learning adapters (PROMPT_TUNING, P_TUNING, PREFIX_TUNING) as guidances.

Only ``adapter_config.json`` and ``adapter_model.safetensors`` are read (safetensors, never
pickle, never PEFT code). PROMPT_TUNING / P_TUNING become a ``SoftPrompt`` at ``start`` (index 0,
before any left padding, as PEFT concatenates); P_TUNING checkpoints hold the prompt encoder's
output, so no encoder is needed. PREFIX_TUNING becomes a key-only ``Prefix``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from anchorlens.errors import UsageError
from anchorlens.tensorfile import load_tensors

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_TYPES = ("PROMPT_TUNING", "P_TUNING", "PREFIX_TUNING")


def is_peft_dir(path: str | Path) -> bool:
    """True when ``path`` holds a PEFT ``adapter_config.json``."""
    return (Path(path).expanduser() / CONFIG_FILE).is_file()


def read_peft_config(path: str | Path) -> dict[str, Any]:
    """The adapter's config; UsageError if absent or of an unsupported type."""
    file = Path(path).expanduser() / CONFIG_FILE
    if not file.is_file():
        raise UsageError(f"{path} is not a PEFT adapter directory (no {CONFIG_FILE})")
    cfg = json.loads(file.read_text())
    kind = str(cfg.get("peft_type", "")).upper()
    if kind not in PEFT_TYPES:
        raise UsageError(f"PEFT adapter {path} is of type {kind or '?'}; anchorlens imports {', '.join(PEFT_TYPES)}")
    return cfg


def _prompt_tensor(path: Path):
    """The saved prompt tensor (``prompt_embeddings``, or the only tensor)."""
    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise UsageError(f"PEFT adapter {path} lacks {WEIGHTS_FILE} (anchorlens never unpickles .bin files)")
    tensors = load_tensors(file, f"PEFT adapter weights of {path}:")
    if "prompt_embeddings" in tensors:
        return tensors["prompt_embeddings"]
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    raise UsageError(f"{file} has tensors {sorted(tensors)}; expected prompt_embeddings")


def peft_guidances(path: str | Path, base) -> list:
    """The adapter at ``path`` as unbound guidances for ``base`` (checked against its width and layers)."""
    from anchorlens.methods.prefix import Prefix
    from anchorlens.methods.soft_prompt import SoftPrompt

    path = Path(path).expanduser()
    cfg = read_peft_config(path)
    kind = str(cfg["peft_type"]).upper()
    n = int(cfg["num_virtual_tokens"])
    tensor = _prompt_tensor(path)
    if kind == "PREFIX_TUNING":
        layers = cfg.get("num_layers")
        if layers is not None and base.adapter.supports_prefix and int(layers) != base.adapter.kv_geometry(base.model)[0]:
            raise UsageError(f"PEFT prefix {path} has {layers} layers; the base {base.spec!r} has {base.num_layers}")
        return [Prefix(n, kv=tensor[:n])]
    if tensor.shape[-1] != base.hidden_size:
        raise UsageError(f"PEFT adapter {path} has width {tensor.shape[-1]}; the base {base.spec!r} has d={base.hidden_size}")
    # T5 (num_transformer_submodules=2) saves 2n rows; the encoder uses the first n.
    return [SoftPrompt(n, position="start", vectors=tensor[:n])]


def load_peft(path: str | Path, base):
    """A PEFT prompt-learning adapter directory as a GuidedModel on ``base``."""
    from anchorlens.methods.guided import GuidedModel

    return GuidedModel(base, peft_guidances(path, base))
