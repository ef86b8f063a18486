"""``load_base(spec)``: the embedded model, a local HF directory, or a tiny random test base."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from anchorlens.errors import UsageError
from anchorlens.models.adapters import adapter_for
from anchorlens.models.base import Base
from anchorlens.models.embedded import EMBEDDED_SPEC, ensure_converted
from anchorlens.models.tiny import TINY_BASES, build_tiny

DEFAULT_BASE = EMBEDDED_SPEC
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype:
    """``"bf16"`` -> torch.bfloat16 etc.; None means float32."""
    if name is None:
        return torch.float32
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise UsageError(f"unknown dtype {name!r}; choose one of: {', '.join(_DTYPES)}")
    return _DTYPES[name]


def _load_hf_dir(path: Path, attn: str, dtype: torch.dtype, device_map: str | None = None) -> tuple[torch.nn.Module, object]:
    """Load a local HF model directory from safetensors only (never pickle, never remote code)."""
    from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM,
                              AutoModelForSeq2SeqLM, AutoTokenizer)

    if not (path / "config.json").is_file():
        raise UsageError(f"{path} is not a HuggingFace model directory (no config.json)")
    if not any(path.glob("*.safetensors")):
        raise UsageError(f"{path} has no .safetensors weights; anchorlens never unpickles .bin files: convert them first")
    config = AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    adapter_for(config.model_type)  # fail early on unsupported architectures
    if getattr(config, "is_encoder_decoder", False):
        auto = AutoModelForSeq2SeqLM
    elif config.model_type == "bert":
        auto = AutoModelForMaskedLM
    else:
        auto = AutoModelForCausalLM
    kwargs = dict(trust_remote_code=False, local_files_only=True, use_safetensors=True, attn_implementation=attn, dtype=dtype)
    if device_map is not None:
        kwargs["device_map"] = device_map  # accelerate spreads a large base over the node's GPUs
    try:
        model = auto.from_pretrained(path, **kwargs)
    except ValueError:
        model = AutoModel.from_pretrained(path, **kwargs)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    return model, tok


def load_base(spec: str = DEFAULT_BASE, *, dtype: str | torch.dtype | None = None, device: str | None = None) -> Base:
    """Load a base by spec: ``smollm2-135m`` (default), ``tiny-llama``/``-qwen2``/``-gpt2``/``-bert``/``-t5``, or a local HF dir.

    ``device``: None (CPU), a torch device (``cuda:0``), or ``auto`` to let accelerate place a large
    HF base across every GPU of the node (``device_map="auto"``).
    """
    device_map = "auto" if device == "auto" else None
    attn = "sdpa"  # capture switches a model to its sdpa-based function only when it first captures
    hf_logging.disable_progress_bar()
    torch_dtype = parse_dtype(dtype)
    if spec in TINY_BASES:
        model, tok = build_tiny(spec, attn)
        model = model.to(torch_dtype)
    elif spec == EMBEDDED_SPEC:
        model, tok = _load_hf_dir(ensure_converted(), attn, torch_dtype, device_map)
    else:
        path = Path(spec).expanduser()
        if not path.exists():
            known = ", ".join((EMBEDDED_SPEC, *TINY_BASES))
            raise UsageError(f"unknown base {spec!r}: not a directory and not one of {known}")
        model, tok = _load_hf_dir(path, attn, torch_dtype, device_map)
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise UsageError(f"the tokenizer of {spec!r} has neither a pad nor an eos token; add a pad token")
        tok.pad_token = tok.eos_token
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if device and device_map is None:
        model.to(device)
    return Base(spec=spec, model=model, tokenizer=tok, adapter=adapter_for(model.config.model_type))
