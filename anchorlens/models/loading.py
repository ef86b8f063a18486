"""``load_base(spec)``: the embedded model, a local HF directory, a hub id, or a tiny random test base."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from anchorlens.devices import check_device
from anchorlens.errors import AnchorlensError, DataError, PathError, UnknownNameError, UsageError
from anchorlens.models.adapters import ArchAdapter, adapter_for
from anchorlens.models.base import Base
from anchorlens.models.embedded import EMBEDDED_SPEC, cache_problem, ensure_converted
from anchorlens.models.hub import cached_snapshot_facts, hub_config_dir, is_hub_id, resolve_hub_dir
from anchorlens.models.lm_class import interface_refusal, lm_auto_class
from anchorlens.models.memory import Availability, available_bytes, check_fits
from anchorlens.models.tiny import TINY_BASES, build_tiny
from anchorlens.models.weights import check_weight_files, from_pretrained_whole

DEFAULT_BASE = EMBEDDED_SPEC
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype:
    """``"bf16"`` -> torch.bfloat16 etc.; None means float32."""
    if name is None:
        return torch.float32
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise UnknownNameError(f"unknown dtype {name!r}; choose one of: {', '.join(_DTYPES)}")
    return _DTYPES[name]


def discovered_adapter(model: torch.nn.Module, label: str = "the base") -> ArchAdapter:
    """The architecture adapter discovered from the loaded model; UsageError (one line) naming ``label`` when it
    cannot be captured exactly."""
    try:
        return adapter_for(model)
    except UsageError as err:
        raise type(err)(f"{label}: {err}") from None


def _read_config(path: Path, label: str) -> dict[str, Any]:
    """config.json as a dict; DataError when it is not valid JSON."""
    try:
        config = json.loads((path / "config.json").read_text())
    except ValueError as err:
        raise DataError(f"config.json of {label} is not valid JSON ({err}); restore or re-download it") from None
    if not isinstance(config, dict):
        raise DataError(f"config.json of {label} is not a JSON object; restore or re-download it")
    return config


def refuse_remote_code(config: dict[str, Any], label: str) -> None:
    """UsageError when the config needs modeling code transformers does not ship (auto_map, unknown model_type)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    if model_type in CONFIG_MAPPING:
        return  # transformers' own implementation is used even when the repo also ships code (auto_map)
    if not model_type and "auto_map" not in config:
        raise DataError(
            f"config.json of {label} has no model_type, so its architecture is unknown; restore the config.json "
            "saved with the model (save_pretrained writes model_type)"
        )
    custom = " (its config.json points to custom code through auto_map)" if "auto_map" in config else ""
    raise UsageError(
        f"anchorlens never runs remote code; {label} has model_type {model_type!r}{custom}, which transformers "
        f"{transformers.__version__} does not implement; use a base whose architecture transformers ships"
    )


def auto_class(config):
    """The transformers Auto class that loads ``config``'s model with its LM head."""
    return lm_auto_class(config)


def preflight(
    path: Path, label: str, dtype: torch.dtype, device: str | None = None, available: Availability | None = None
):
    """Refuse a model directory before loading (no config, remote code, unsupported family, too large); its config.

    ``path`` needs only its config.json. ``available(device)`` gives the free bytes of the target
    (None: skip the memory check); the estimate comes from the config on empty weights.
    """
    from transformers import AutoConfig

    if not (path / "config.json").is_file():
        raise UsageError(f"{label} is not a HuggingFace model directory (no config.json)")
    refuse_remote_code(_read_config(path, label), label)
    config = AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    refusal = interface_refusal(config)  # fail before any download when capture could not see the attention
    if refusal is not None:
        raise UsageError(f"{label}: {refusal}")
    if available is not None:
        check_fits(label, config, dtype, device, auto_class(config), available)
    return config


_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
)


def _load_tokenizer(path: Path, label: str) -> Any:
    """The tokenizer saved in ``path``; UsageError/DataError (one line) when there is none or it cannot load."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    except AnchorlensError:
        raise
    except Exception as err:  # transformers' many ways of failing on tokenizer files become one line
        if not any((path / name).is_file() for name in _TOKENIZER_FILES):
            raise UsageError(f"no tokenizer in {label}; save one with tokenizer.save_pretrained({label!r})") from None
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(
            f"the tokenizer in {label} does not load ({reason}); re-save it with tokenizer.save_pretrained({label!r})"
        ) from None


def _load_hf_dir(
    path: Path,
    dtype: torch.dtype,
    device_map: str | None = None,
    *,
    label: str | None = None,
    device: str | None = None,
    available: Availability | None = None,
) -> tuple[torch.nn.Module, object]:
    """Load a local HF model directory from safetensors only (never pickle, never remote code).

    The attention implementation is transformers' own choice (sdpa, or eager where a family needs it);
    capture switches to its sdpa-based function only when it first captures. ``available``: see :func:`preflight` (None: no memory check).
    Damaged or missing weight files, and weights that leave part of the model randomly initialised, are refused.
    """
    from transformers import AutoModel

    label = label or str(path)
    if (path / "config.json").is_file() and not any(path.glob("*.safetensors")):
        raise UsageError(
            f"{label} has no .safetensors weights; anchorlens never unpickles .bin files: convert them first"
        )
    config = preflight(path, label, dtype, "auto" if device_map == "auto" else device, available)
    check_weight_files(path, label)
    auto = auto_class(config)
    kwargs: dict[str, Any] = dict(
        trust_remote_code=False, local_files_only=True, use_safetensors=True, attn_implementation=None, dtype=dtype
    )
    if device_map is not None:
        kwargs["device_map"] = device_map  # accelerate spreads a large base over the node's GPUs
    try:
        model = from_pretrained_whole(auto, path, label, kwargs)
    except AnchorlensError:
        raise
    except ValueError:
        model = from_pretrained_whole(AutoModel, path, label, kwargs)
    tok = _load_tokenizer(path, label)
    return model, tok


def _load_embedded(dtype: torch.dtype, device_map: str | None) -> tuple[torch.nn.Module, object, Path]:
    """The embedded model from its verified cache; a cache that still fails to load is checked by digest and rebuilt."""
    path = ensure_converted()
    try:
        model, tok = _load_hf_dir(path, dtype, device_map)
    except Exception as err:
        if isinstance(err, AnchorlensError) and not isinstance(err, (DataError, PathError)):
            raise  # the user's problem (memory, device), not damage to the files
        if cache_problem(path, None, digests=True) is None:
            raise  # the cache is what was converted: the failure is not the cache's
        path = ensure_converted(verify=True)  # same-size damage shows only in the digests
        model, tok = _load_hf_dir(path, dtype, device_map)
    return model, tok, path


def check_decoder_start(config: Any, label: str) -> None:
    """UsageError when an encoder-decoder config has no ``decoder_start_token_id`` (transformers refuses it too)."""
    if not getattr(config, "is_encoder_decoder", False) or getattr(config, "decoder_start_token_id", None) is not None:
        return
    pad = getattr(config, "pad_token_id", None)
    t5 = "t5" in str(getattr(config, "model_type", ""))
    usual = f" (T5 uses its pad_token_id, {pad})" if t5 and pad is not None else ""
    raise UsageError(
        f"{label}: config.json has no decoder_start_token_id; set it to the token the decoder starts from{usual}"
    )


def load_base(
    spec: str = DEFAULT_BASE,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | None = None,
    available_memory: Availability = available_bytes,
) -> Base:
    """Load a base: ``smollm2-135m`` (default), ``tiny-*``, a local HF dir, or a hub id ``ORG/NAME[@REVISION]``.

    An existing local directory wins over a hub id of the same spelling. Hub ids resolve through
    huggingface_hub and the HF cache (``HF_HUB_CACHE``, ``HF_HUB_OFFLINE=1`` honoured).
    ``device``: None (CPU), a torch device (``cuda:0``), or ``auto`` to let accelerate place a large
    HF base across every GPU of the node (``device_map="auto"``). ``available_memory(device)``: free
    bytes of the target (None: unknown); a base estimated larger is refused before loading.
    """
    device = check_device(device)  # one line for a device this machine lacks, before anything loads
    device_map = "auto" if device == "auto" else None
    hf_logging.disable_progress_bar()
    torch_dtype = parse_dtype(dtype)
    origin: dict[str, Any]
    check: Availability | None = available_memory
    model: Any
    tok: Any
    if spec in TINY_BASES:
        model, tok = build_tiny(spec)
        model = model.to(torch_dtype)
        origin = {"kind": "tiny"}
    elif spec == EMBEDDED_SPEC:
        model, tok, path = _load_embedded(torch_dtype, device_map)
        origin = {"kind": "embedded", "path": str(path)}
    else:
        path = Path(spec).expanduser()
        if path.exists():
            origin = {"kind": "local", "path": str(path.resolve()), **cached_snapshot_facts(path)}
            label = str(path)
        elif is_hub_id(spec):
            target = "auto" if device_map == "auto" else device
            preflight(hub_config_dir(spec), spec, torch_dtype, target, check)  # before any weights download
            path, origin = resolve_hub_dir(spec, kind="model")
            label, check = spec, None
        else:
            known = ", ".join((EMBEDDED_SPEC, *TINY_BASES))
            raise UnknownNameError(
                f"unknown base {spec!r}: not a directory, not a hub id ORG/NAME, and not one of {known}"
            )
        model, tok = _load_hf_dir(path, torch_dtype, device_map, label=label, device=device, available=check)
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise UsageError(f"the tokenizer of {spec!r} has neither a pad nor an eos token; add a pad token")
        tok.pad_token = tok.eos_token
    check_decoder_start(model.config, spec)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if device and device_map is None:
        model.to(device)
    adapter = discovered_adapter(model, spec)
    return Base(spec=spec, model=model, tokenizer=tok, adapter=adapter, origin={"spec": spec, **origin})
