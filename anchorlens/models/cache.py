"""A verified cache directory: a record of its source and of every file's size and sha256, checked on use.

Sizes (and the structure of config.json and every safetensors header) are checked on every use,
which is cheap; digests only when asked. Writers hold :func:`locked` so concurrent first builds wait
for each other instead of corrupting the directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from anchorlens.atomic import OWNER_FILE, write_json

RECORD = "anchorlens-cache.json"
RECORD_FORMAT = 2
_CHUNK = 1 << 22


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _files(directory: Path) -> list[Path]:
    """Regular files under ``directory`` except the record and an atomic-dir owner file."""
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name not in (RECORD, OWNER_FILE))


def source_facts(source: Path, digest: bool = True) -> dict[str, Any]:
    """Name, size and (optionally) sha256 of a source file."""
    facts: dict[str, Any] = {"name": source.name, "size": source.stat().st_size}
    if digest:
        facts["sha256"] = file_sha256(source)
    return facts


def write_record(directory: Path, source: Path | dict[str, Any], cache_format: int) -> dict[str, Any]:
    """Record ``source`` (a file or its facts) and every file's size and sha256 in ``directory``'s record."""
    record = {
        "format": RECORD_FORMAT,
        "cache_format": cache_format,
        "source": source if isinstance(source, dict) else source_facts(source),
        "files": {
            p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)}
            for p in _files(directory)
        },
    }
    write_json(directory / RECORD, record)
    return record


def read_record(directory: Path) -> dict[str, Any] | None:
    """The record of ``directory``, or None when absent or unreadable."""
    try:
        obj = json.loads((directory / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is unusable (truncated, bad header), judged from its header alone; None if whole."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} is truncated"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"{path.name} is truncated"
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError):
        return f"{path.name} has an unreadable header"
    if not isinstance(header, dict):
        return f"{path.name} has an unreadable header"
    ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    if 8 + n + max(ends, default=0) != size:
        return f"{path.name} is truncated"
    return None


def structure_problem(directory: Path) -> str | None:
    """Why ``directory`` is not a whole HF model dir (config.json, safetensors headers); None if it is."""
    try:
        json.loads((directory / "config.json").read_text())
    except FileNotFoundError:
        return "config.json is missing"
    except (OSError, ValueError):
        return "config.json is damaged"
    weights = sorted(directory.glob("*.safetensors"))
    if not weights:
        return "it holds no weights"
    for path in weights:
        problem = safetensors_problem(path)
        if problem:
            return problem
    return None


def record_problem(directory: Path, record: dict[str, Any], digests: bool) -> str | None:
    """Why ``directory`` differs from its record (missing file, size, sha256 when ``digests``); None if equal."""
    files = record.get("files")
    if not isinstance(files, dict) or not files:
        return "its record lists no files"
    for name, facts in files.items():
        path = directory / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != facts.get("size"):
            return f"{name} has {size} bytes, not {facts.get('size')}"
        if digests and file_sha256(path) != facts.get("sha256"):
            return f"{name} differs from its recorded sha256"
    return None


def source_problem(record: dict[str, Any], source: Path | None, digests: bool) -> str | None:
    """Why ``source`` is not the file the cache was built from (name, size, sha256 when ``digests``)."""
    if source is None:
        return None
    want = record.get("source") or {}
    try:
        have = source_facts(source, digest=digests)
    except OSError:
        return None  # the source is gone; the cache still stands on its own
    for key in ("name", "size", "sha256"):
        if key in have and key in want and have[key] != want[key]:
            return f"its source {source.name} changed ({key})"
    return None


@contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if needed; never removed, to keep it race-free)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
