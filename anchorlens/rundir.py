"""Run directories written atomically: a temp sibling renamed into place, never a half-written DIR."""
from __future__ import annotations

import hashlib
import json
import platform
import shutil
import sys
import tempfile
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Iterator

from anchorlens.errors import UsageError


def check_writable(path: Path, force: bool) -> None:
    """Refuse an existing, non-empty ``path`` unless ``force``; refuse a file where a DIR is wanted."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{path} exists and is not a directory; choose another --out")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise UsageError(f"{path} already exists; pass --force to replace it or choose another --out")


@contextmanager
def atomic_run_dir(path: str | Path, force: bool = False) -> Iterator[Path]:
    """Yield a temp dir to fill; on success it replaces ``path``, on error nothing is left behind."""
    target = Path(path).expanduser()
    check_writable(target, force)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{datetime.now().strftime('%H%M%S%f')}")
        target.rename(old)
    tmp.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def file_digest(path: str | Path) -> str:
    """SHA-256 (first 16 hex) of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def examples_digest(examples: list[dict]) -> str:
    """SHA-256 (first 16 hex) of the examples as canonical JSON."""
    blob = json.dumps(examples, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def manifest(**facts) -> dict:
    """Provenance: command line, versions, time, plus the given facts (base fingerprint, data hash, seed)."""
    return {
        "command": sys.argv,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "versions": {d: _version(d) for d in ("anchorlens", "torch", "transformers", "numpy", "pandas")},
        **facts,
    }


def write_json(path: Path, obj) -> Path:
    """Write ``obj`` as indented JSON."""
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    return path
