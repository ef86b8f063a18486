"""Resumable streaming: reducer states saved per chunk of examples, so a killed run picks up where it stopped.

Examples are cut into fixed chunks (``chunk_indices``). After a chunk is reduced, its reducers'
states are written to ``OUT/.progress/shard-XXXXX.safetensors`` (tensors; the JSON skeleton sits in
the safetensors metadata) and then ``shard-XXXXX.json`` (run key, chunk, example ids), each through
a temp file and ``os.replace``; the json is the commit marker. ``run.json`` holds the run key: a
re-run with the same key skips finished chunks and merges their saved states, so the result
equals an uninterrupted run exactly (each example lives in one chunk; sums start from zero).
No pickle anywhere: safetensors + JSON. Files are written through :mod:`anchorlens.atomic`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from anchorlens.atomic import atomic_write, clean_stale_temps, write_json
from anchorlens.capture.reducer import Reducer
from anchorlens.rundir import PROGRESS_DIR
from anchorlens.runtime.codec import state_from_tensors, state_to_tensors

RUN_FILE = "run.json"


def chunk_indices(n: int, chunk_size: int) -> list[list[int]]:
    """``[[0..cs-1], [cs..2cs-1], ...]`` covering ``range(n)``."""
    if chunk_size < 1:
        raise ValueError(f"chunk size must be at least 1, got {chunk_size}")
    return [list(range(s, min(s + chunk_size, n))) for s in range(0, n, chunk_size)]


def _read_json(path: Path) -> dict | None:
    """A JSON object from ``path``, or None when absent or unreadable."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


class Progress:
    """The finished chunks of one run (identified by ``run_key``) under ``OUT/.progress``."""

    def __init__(self, out: str | Path, run_key: str) -> None:
        self.dir = Path(out) / PROGRESS_DIR
        self.run_key = run_key

    @staticmethod
    def stored_key(out: str | Path) -> str | None:
        """The run key of the progress under ``out``, or None when there is none."""
        info = _read_json(Path(out) / PROGRESS_DIR / RUN_FILE)
        return None if info is None else str(info.get("run_key"))

    def start(self, facts: dict | None = None) -> None:
        """Create the directory, drop temp files of killed writers and record the run key (idempotent).

        Called under the run's claim on OUT, so every temp file in the directory is a dead writer's.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(self.dir, max_age_s=0)
        write_json(self.dir / RUN_FILE, {"run_key": self.run_key, **(facts or {})}, sort_keys=True)

    def paths(self, chunk: int) -> tuple[Path, Path]:
        """(safetensors, json) paths of a chunk."""
        stem = self.dir / f"shard-{chunk:05d}"
        return stem.with_suffix(".safetensors"), stem.with_suffix(".json")

    def done(self, chunk: int, example_ids: Sequence[int]) -> bool:
        """Whether ``chunk`` was finished by this run, on exactly ``example_ids``."""
        tensors, marker = self.paths(chunk)
        info = _read_json(marker)
        return (
            info is not None
            and tensors.is_file()
            and info.get("run_key") == self.run_key
            and info.get("chunk") == chunk
            and info.get("example_ids") == [int(i) for i in example_ids]
        )

    def finished(self) -> list[int]:
        """Chunk indices with a commit marker of this run."""
        out = []
        for marker in sorted(self.dir.glob("shard-*.json")):
            info = _read_json(marker)
            if info is not None and info.get("run_key") == self.run_key:
                out.append(int(info["chunk"]))
        return out

    def save(self, chunk: int, example_ids: Sequence[int], reducers: Sequence[Reducer]) -> None:
        """Write the chunk's reducer states, then its marker (both atomically)."""
        tensors_path, marker = self.paths(chunk)
        skeleton, tensors = state_to_tensors([r.state_dict() for r in reducers])
        meta = {"skeleton": json.dumps(skeleton), "run_key": self.run_key}
        atomic_write(tensors_path, lambda p: save_file(tensors, str(p), metadata=meta))
        write_json(
            marker,
            {"run_key": self.run_key, "chunk": chunk, "example_ids": [int(i) for i in example_ids]},
            sort_keys=True,
        )

    def load(self, chunk: int, reducers: Sequence[Reducer]) -> None:
        """Load the chunk's saved states into ``reducers`` (fresh ones of the same kinds and options)."""
        tensors_path, _ = self.paths(chunk)
        with safe_open(str(tensors_path), framework="pt") as fh:
            meta = fh.metadata() or {}
        if meta.get("run_key") != self.run_key:
            raise ValueError(f"{tensors_path} belongs to another run")
        states = state_from_tensors(json.loads(meta["skeleton"]), load_file(str(tensors_path)))
        if len(states) != len(reducers):
            raise ValueError(f"{tensors_path} holds {len(states)} reducer states, expected {len(reducers)}")
        for reducer, state in zip(reducers, states):
            reducer.load_state_dict(state)

    def try_load(self, chunk: int, reducers: Sequence[Reducer]) -> bool:
        """:meth:`load`, but False (chunk to recompute) when the shard is unreadable or inconsistent."""
        try:
            self.load(chunk, reducers)
        except Exception:  # noqa: BLE001 - a damaged shard is recomputed, never trusted
            return False
        return True

    def clear(self) -> None:
        """Remove the progress directory."""
        shutil.rmtree(self.dir, ignore_errors=True)


def run_chunks(
    chunks: Sequence[tuple[int, Sequence[int]]],
    compute: Callable[[Sequence[int], Sequence[Reducer]], None],
    make_reducers: Callable[[], list[Reducer]],
    progress: Progress | None = None,
    on_chunk: Callable[[int, bool], None] | None = None,
    on_chunk_saved: Callable[[int], None] | None = None,
) -> list[Reducer]:
    """Reduce ``(chunk index, example ids)`` chunks, reusing saved ones; returns the merged reducers.

    compute(ids, reducers) folds the examples ``ids`` into fresh ``reducers``. on_chunk(n, resumed)
    is called after each chunk with its size and whether it came from disk; on_chunk_saved(chunk)
    right after a computed chunk is committed to ``progress``. A saved chunk that
    cannot be read back (truncated, edited, another run's) is recomputed and saved again.
    """
    total = make_reducers()
    for chunk, ids in chunks:
        part = make_reducers()
        resumed = progress is not None and progress.done(chunk, ids) and progress.try_load(chunk, part)
        if not resumed:
            part = make_reducers()
            compute(ids, part)
            if progress is not None:
                progress.save(chunk, ids, part)
                if on_chunk_saved is not None:
                    on_chunk_saved(chunk)
        for t, p in zip(total, part):
            t.merge(p)
        if on_chunk is not None:
            on_chunk(len(ids), resumed)
    return total
