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

from anchorlens.errors import CheckpointError, UsageError
from anchorlens.methods.peft_base import CONFIG_FILE, check_peft_base
from anchorlens.methods.peft_files import INJECTED_TYPES, PEFT_TYPES, WEIGHTS_FILE, read_adapter_json
from anchorlens.tensorfile import check_float_tensors, load_tensors

_INT_FIELDS = ("num_virtual_tokens", "token_dim", "num_layers", "num_transformer_submodules", "num_attention_heads")


def _fail(file: Path, message: str) -> CheckpointError:
    return CheckpointError(f"{file}: {message}")


def read_peft_config(path: str | Path) -> dict[str, Any]:
    """The adapter's validated config; CheckpointError naming the file and field when absent, malformed or unsupported."""
    file = Path(path).expanduser() / CONFIG_FILE
    cfg = read_adapter_json(path)
    kind = cfg.get("peft_type")
    if not isinstance(kind, str) or kind.upper() not in PEFT_TYPES:
        raise UsageError(
            f"PEFT adapter {path} is of type {kind or '?'}; anchorlens loads {', '.join(PEFT_TYPES)} "
            f"(as guidance) and {', '.join(INJECTED_TYPES)} (applied by PEFT)"
        )
    for key in _INT_FIELDS:
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise _fail(file, f"field {key} must be a positive integer; got {json.dumps(value)[:60]}")
    if cfg.get("num_virtual_tokens") is None:
        raise _fail(file, "field num_virtual_tokens is missing")
    name = cfg.get("base_model_name_or_path")
    if name is not None and not isinstance(name, str):
        raise _fail(file, f"field base_model_name_or_path must be a string; got {json.dumps(name)[:60]}")
    return cfg


def _prompt_tensor(path: Path):
    """The saved prompt tensor (``prompt_embeddings``, or the only tensor), checked finite and floating."""
    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise UsageError(f"PEFT adapter {path} lacks {WEIGHTS_FILE} (anchorlens never unpickles .bin files)")
    tensors = load_tensors(file, f"PEFT adapter weights of {path}:")
    check_float_tensors(tensors, file)
    if "prompt_embeddings" in tensors:
        return tensors["prompt_embeddings"]
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    raise CheckpointError(f"{file} has tensors {sorted(tensors)}; expected prompt_embeddings")


def _expected_rows(cfg: dict[str, Any], kind: str) -> int:
    """Rows PEFT saves: n for prefixes, n x transformer submodules (2 for seq2seq) for prompts."""
    n = int(cfg["num_virtual_tokens"])
    if kind == "PREFIX_TUNING":
        return n
    default = 2 if str(cfg.get("task_type", "")).upper() == "SEQ_2_SEQ_LM" else 1
    return n * int(cfg.get("num_transformer_submodules") or default)


def peft_guidances(
    path: str | Path, base, *, allow_other_base: bool = False, notes: list[dict[str, Any]] | None = None
) -> list:
    """The adapter at ``path`` as unbound guidances for ``base`` (checked against its width, layers and name)."""
    from anchorlens.methods.prefix import Prefix, PrefixConfig
    from anchorlens.methods.soft_prompt import PromptConfig, SoftPrompt

    path = Path(path).expanduser()
    cfg = read_peft_config(path)
    file = path / CONFIG_FILE
    kind = str(cfg["peft_type"]).upper()
    n = int(cfg["num_virtual_tokens"])
    facts = check_peft_base(cfg, base, path, allow_other_base)
    try:  # bounds before reading tensors sized by the config
        (PrefixConfig(n=n) if kind == "PREFIX_TUNING" else PromptConfig(n=n)).check_fits(base)
    except UsageError as err:
        raise _fail(file, f"field num_virtual_tokens: {err}") from None
    tensor = _prompt_tensor(path)
    rows = _expected_rows(cfg, kind)
    if tensor.dim() != 2 or tensor.shape[0] != rows:
        raise _fail(
            file,
            f"field num_virtual_tokens={n} needs {rows} saved prompt rows but {WEIGHTS_FILE} holds {tuple(tensor.shape)}; "
            "PEFT itself refuses this adapter (size mismatch)",
        )
    if notes is not None:
        notes.extend(facts)
    if kind == "PREFIX_TUNING":
        layers = cfg.get("num_layers")
        if (
            layers is not None
            and base.adapter.supports_prefix
            and int(layers) != base.adapter.kv_geometry(base.model)[0]
        ):
            raise _fail(file, f"field num_layers is {layers}; the base {base.spec!r} has {base.num_layers}")
        return [Prefix(n, kv=tensor)]
    if tensor.shape[-1] != base.hidden_size:
        none = "" if cfg.get("base_model_name_or_path") else " (the adapter records no base model)"
        raise _fail(
            file,
            f"the prompt has width {tensor.shape[-1]}; the base {base.spec!r} has d={base.hidden_size}{none}; "
            "load it on its own base",
        )
    # T5 (num_transformer_submodules=2) saves 2n rows; the encoder uses the first n.
    return [SoftPrompt(n, position="start", vectors=tensor[:n])]


def load_peft(path: str | Path, base, *, allow_other_base: bool = False):
    """A PEFT prompt-learning adapter directory as a GuidedModel on ``base``."""
    from anchorlens.methods.guided import GuidedModel

    notes: list[dict[str, Any]] = []
    guided = GuidedModel(base, peft_guidances(path, base, allow_other_base=allow_other_base, notes=notes))
    if notes:
        guided.meta["other_base"] = notes
    return guided
