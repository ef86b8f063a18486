"""Resumable, out-of-core streaming: each chunk of examples is written to disk as its metric rows once reduced.

Examples are cut into fixed chunks (``chunk_indices``). A chunk is reduced by fresh reducers, turned into its
tidy metric rows (derived metrics and mask flags included: every metric is per example, so a chunk's rows are
final) and written to ``OUT/.progress/shard-XXXXX.arrow``, then ``shard-XXXXX.json`` (run key, chunk,
example ids, row count), each through a temp file and ``os.replace``; the json is the commit marker. Nothing
of a finished chunk stays in memory: a run holds one chunk's reducer state and rows at a time, whatever the
number of examples. ``run.json`` holds the run key and the facts it hashes (so a refused resume can name what
changed): a re-run with the same key skips finished chunks, and
:func:`concat_shards` streams the shards into one parquet file (a row group per chunk), so the result equals
an uninterrupted run exactly. Ranks write their own chunks; merging is concatenation (no exchange of
per-example data). No pickle anywhere. Files are written through :mod:`anchorlens.atomic`.

Shards are Arrow IPC files (labels dictionary-encoded, buffers lz4-compressed): a shard is written once and read
once, and IPC takes about a sixth of parquet's time to write and a tenth to read; only the final file is parquet.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from anchorlens.analyses.rows import Rows
from anchorlens.atomic import atomic_write, clean_stale_temps, os_errors, write_json
from anchorlens.errors import DataError
from anchorlens.heap import release_free_memory
from anchorlens.rundir import PROGRESS_DIR

RUN_FILE = "run.json"
SHARD_SUFFIX = ".arrow"  # Arrow IPC (module docstring)


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

    @staticmethod
    def stored_facts(out: str | Path) -> dict | None:
        """What the run under ``out`` recorded when it started (its run key and the facts it hashes: model,
        data, prompt options, chat template...), or None when there is no readable record."""
        return _read_json(Path(out) / PROGRESS_DIR / RUN_FILE)

    def start(self, facts: dict | None = None) -> None:
        """Create the directory, drop temp files of killed writers and record the run key (idempotent).

        Called under the run's claim on OUT, so every temp file in the directory is a dead writer's.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(self.dir, max_age_s=0)
        write_json(self.dir / RUN_FILE, {"run_key": self.run_key, **(facts or {})}, sort_keys=True)

    def paths(self, chunk: int) -> tuple[Path, Path]:
        """(rows, commit marker) paths of a chunk."""
        stem = self.dir / f"shard-{chunk:05d}"
        return stem.with_suffix(SHARD_SUFFIX), stem.with_suffix(".json")

    def done(self, chunk: int, example_ids: Sequence[int]) -> bool:
        """Whether ``chunk`` was finished by this run, on exactly ``example_ids``, and its rows read back whole."""
        rows, marker = self.paths(chunk)
        info = _read_json(marker)
        if not (
            info is not None
            and rows.is_file()
            and info.get("run_key") == self.run_key
            and info.get("chunk") == chunk
            and info.get("example_ids") == [int(i) for i in example_ids]
        ):
            return False
        try:  # a truncated or edited shard is recomputed, never trusted
            key, n_rows = _shard_facts(rows)
        except Exception:  # noqa: BLE001
            return False
        return n_rows == info.get("rows") and key == self.run_key

    def finished(self) -> list[int]:
        """Chunk indices with a commit marker of this run."""
        out = []
        for marker in sorted(self.dir.glob("shard-*.json")):
            info = _read_json(marker)
            if info is not None and info.get("run_key") == self.run_key:
                out.append(int(info["chunk"]))
        return out

    def read(self, chunk: int, dictionary: bool = False) -> Any:
        """A finished chunk's rows as an Arrow table with the metric frame's schema: labels as strings, or as
        they are stored (dictionary-encoded) with ``dictionary``."""
        import pyarrow as pa

        with pa.OSFile(str(self.paths(chunk)[0]), "rb") as source:  # read into memory: nothing left mapped
            table = pa.ipc.open_file(source, memory_pool=_arrow_pool()).read_all()
        table = table if dictionary else table.cast(_plain_schema(table.schema))
        return table.replace_schema_metadata(None)

    def marker(self, chunk: int) -> dict | None:
        """The commit marker of ``chunk`` when this run wrote it (its run key, example ids, rows and the facts
        :meth:`save` was given), else None."""
        info = _read_json(self.paths(chunk)[1])
        return info if info is not None and info.get("run_key") == self.run_key else None

    def save(
        self,
        chunk: int,
        example_ids: Sequence[int],
        rows: pd.DataFrame | Rows,
        *,
        recorded: Mapping[str, Any] | None = None,
    ) -> int:
        """Write the chunk's metric rows (a frame, or :class:`~anchorlens.analyses.rows.Rows`: no frame is built),
        then its marker (both atomically); returns the number of rows. ``recorded``: what else the marker records about
        the chunk (JSON values, e.g. the plan each attention site took), read back with :meth:`marker`."""
        rows_path, marker = self.paths(chunk)
        facts = {"run_key": self.run_key, "chunk": str(chunk)}
        if isinstance(rows, pd.DataFrame):
            table = frame_table(rows, facts).combine_chunks()
            table = table.cast(_dictionary_schema(table.schema))  # one dictionary per label column
        else:
            table = rows.arrow()
            table = table.replace_schema_metadata({b"anchorlens": json.dumps(facts)})

        def write(path: Path) -> None:
            import pyarrow as pa

            options = pa.ipc.IpcWriteOptions(compression="lz4")
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema, options=options) as writer:
                writer.write_table(table)

        atomic_write(rows_path, write)
        write_json(
            marker,
            {
                **(recorded or {}),
                "run_key": self.run_key,
                "chunk": chunk,
                "example_ids": [int(i) for i in example_ids],
                "rows": table.num_rows,
            },
            sort_keys=True,
        )
        return table.num_rows

    def clear(self) -> None:
        """Remove the progress directory."""
        shutil.rmtree(self.dir, ignore_errors=True)


def _shard_facts(path: Path) -> tuple[str | None, int]:
    """(run key, rows) of a shard file; raises when it is not a whole Arrow IPC file (truncated, cut short).

    A body damaged in place under an intact footer passes here; :func:`concat_shards` finds it when it decodes the
    rows, and sets the chunk aside for the rerun."""
    import pyarrow as pa

    with pa.OSFile(str(path), "rb") as source:  # the footer and batch headers only: nothing is decompressed
        reader = pa.ipc.open_file(source)
        rows = reader.count_rows()
        raw = (reader.schema.metadata or {}).get(b"anchorlens")
    try:
        key = json.loads(raw).get("run_key") if raw is not None else None
    except ValueError:
        key = None
    return key, rows


def _dictionary_schema(schema: Any) -> Any:
    """``schema`` with its string columns dictionary-encoded (a shard's labels repeat over many rows)."""
    import pyarrow as pa

    fields = [f.with_type(pa.dictionary(pa.int32(), pa.string())) if f.type == pa.string() else f for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def _plain_schema(schema: Any) -> Any:
    """``schema`` with dictionary-encoded columns back to their value type."""
    import pyarrow as pa

    fields = [f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def frame_table(frame: pd.DataFrame, facts: dict[str, str] | None = None) -> Any:
    """A metric frame as an Arrow table with the one schema every shard shares (``facts`` in its metadata)."""
    import pyarrow as pa

    from anchorlens.analyses.frames import arrow_schema

    schema = arrow_schema(frame.columns)
    table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False)
    if facts:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"anchorlens": json.dumps(facts)})
    return table


def run_chunks(
    chunks: Sequence[tuple[int, Sequence[int]]],
    compute: Callable[[Sequence[int]], pd.DataFrame | Rows],
    progress: Progress,
    on_chunk: Callable[[int, bool, int], None] | None = None,
    on_chunk_saved: Callable[[int], None] | None = None,
    marker_facts: Callable[[], Mapping[str, Any]] | None = None,
) -> int:
    """Compute and save every ``(chunk index, example ids)`` chunk not already finished; returns rows written.

    compute(ids) returns the chunk's metric rows. on_chunk(n, resumed, rows) is called after each chunk with its
    size, whether it came from disk and its rows; on_chunk_saved(chunk) right after a computed chunk is
    committed. marker_facts(), called right after compute, gives what the chunk's commit marker records beside its
    rows (:meth:`Progress.save`). A saved chunk that cannot be read back (truncated, edited, another run's) is
    recomputed.
    """
    written = 0
    for chunk, ids in chunks:
        resumed = progress.done(chunk, ids)
        rows = 0
        if not resumed:
            computed = compute(ids)
            rows = progress.save(chunk, ids, computed, recorded=marker_facts() if marker_facts is not None else None)
            written += rows
            release_free_memory()  # the chunk's arrays are gone: their pages go back, not into a growing heap
            if on_chunk_saved is not None:
                on_chunk_saved(chunk)
        if on_chunk is not None:
            on_chunk(len(ids), resumed, rows)
    return written


def require_done(progress: Progress, chunks: Sequence[tuple[int, Sequence[int]]]) -> None:
    """A one-line DataError naming the chunks whose shards are missing or damaged (a rank that died, a truncated
    file): the rerun recomputes them."""
    missing = [c for c, ids in chunks if not progress.done(c, ids)]
    if missing:
        raise DataError(
            f"{progress.dir}: chunk(s) {', '.join(map(str, missing[:5]))} of this run are missing or damaged "
            "(a rank stopped before writing them); rerun the same command to compute them"
        )


def _read_whole(progress: Progress, chunk: int) -> Any:
    """The chunk's rows (dictionary labels); a shard whose rows cannot be decoded loses its commit marker (so the
    rerun recomputes the chunk) and is a one-line DataError."""
    import pyarrow as pa

    try:
        return progress.read(chunk, dictionary=True)
    except (OSError, pa.ArrowException) as err:
        progress.paths(chunk)[1].unlink(missing_ok=True)
        raise DataError(
            f"{progress.paths(chunk)[0]}: the rows of chunk {chunk} are damaged ({str(err).splitlines()[0]}); "
            "rerun the same command to compute them again"
        ) from None


def _arrow_pool() -> Any:
    """The memory pool shard reads and the parquet writer allocate from: the system allocator, whose freed pages
    :func:`~anchorlens.heap.release_free_memory` returns between chunks (Arrow's default pool hands them back on
    its own timer, so a concat after a long forward pays page faults on every buffer: ~40% of its time)."""
    import pyarrow as pa

    return pa.system_memory_pool()


def _parquet_options(schema: Any) -> dict[str, Any]:
    """How ``metrics.parquet`` is encoded: zstd, dictionaries and min/max statistics for every column but the
    float ``value`` (unique per row: its dictionary overflows and its statistics serve no filter), no Arrow
    schema (readers get plain strings). About a third cheaper to write than pyarrow's defaults; the same
    columns read back."""
    keys = [name for name in schema.names if name != "value"]
    return {
        "compression": "zstd",
        "use_dictionary": keys,
        "write_statistics": keys,
        "store_schema": False,
        "memory_pool": _arrow_pool(),
    }


def concat_shards(progress: Progress, chunks: Sequence[tuple[int, Sequence[int]]], out: Path) -> int:
    """Stream the chunks' shards, in chunk order, into one parquet file at ``out`` (atomically); returns its rows.

    Memory holds one shard at a time. A missing or damaged shard (a rank that died, a truncated file) is a
    one-line DataError naming the chunk: the rerun recomputes it. The labels go to parquet as the shards hold
    them (dictionary-encoded, which is how parquet stores them anyway) and without the Arrow schema, so
    readers get plain string columns.
    """
    import pyarrow.parquet as pq

    require_done(progress, chunks)
    total = 0

    def write(path: Path) -> None:
        nonlocal total
        writer = None
        try:
            for chunk, _ids in chunks:
                table = _read_whole(progress, chunk)
                if writer is None:
                    writer = pq.ParquetWriter(path, table.schema, **_parquet_options(table.schema))
                writer.write_table(table)
                total += table.num_rows
        finally:
            if writer is not None:
                writer.close()

    with os_errors(out, "cannot write"):
        atomic_write(out, write)
    return total
