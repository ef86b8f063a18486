"""Where examples come from: ``--data`` parsed and opened as a memory-mapped HF ``datasets.Dataset``.

Accepted: ``.jsonl``/``.json``, ``.csv``, ``.tsv``, ``.parquet``, ``.txt`` (one document per line, for plain
text), a directory written by ``datasets.save_to_disk`` (``DIR@SPLIT`` picks a split of a DatasetDict), and
a hub dataset ``hf:ORG/NAME[:CONFIG][@SPLIT]`` resolved from the local HF cache without the network (its
commit recorded, like a model hub id's). Files are read by HF ``datasets`` into Arrow files it memory-maps,
so a million-row parquet file is never read into memory; the converted copy lives in the datasets cache
(``HF_DATASETS_CACHE``) and is reused while the file is unchanged.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anchorlens.atomic import os_errors
from anchorlens.errors import DataError, PathError, UsageError
from anchorlens.rundir import file_digest

FORMATS: dict[str, str] = {
    ".jsonl": "json",
    ".json": "json",
    ".ndjson": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".txt": "text",
    ".arrow": "arrow",
}
HF_PREFIX = "hf:"
_HF_ID = re.compile(r"(?P<repo>[\w.-]+(?:/[\w.-]+)?)(?::(?P<config>[\w.-]+))?(?:@(?P<split>[\w.\[\]:%-]+))?")


@dataclass(frozen=True)
class DataSource:
    """A parsed ``--data``: a file (``path`` and its ``format``), a saved dataset directory, or a hub dataset."""

    spec: str
    kind: str  # "file", "saved" or "hub"
    path: Path | None = None
    format: str | None = None
    repo_id: str | None = None
    config: str | None = None
    split: str | None = None

    @property
    def line_numbered(self) -> bool:
        """Whether rows map to lines of the file (jsonl, txt): errors then say FILE:LINE, else FILE: row N (a JSON
        array, whose rows need not be one per line)."""
        if self.kind != "file" or self.format not in ("json", "text") or self.path is None:
            return False
        return self.format == "text" or not _json_array(self.path)


@dataclass
class OpenedData:
    """A source opened as a ``datasets.Dataset`` (``table``), what to record about it (``facts``) and, for a file,
    its content's sha256 (first 16 hex, ``digest``)."""

    source: DataSource
    table: Any
    facts: dict[str, Any] = field(default_factory=dict)
    digest: str | None = None


def _json_array(path: Path) -> bool:
    """Whether a JSON file holds one array (``[{...}, {...}]``) rather than one object per line."""
    try:
        if not path.is_file():  # a FIFO would block the read
            return False
        with path.open("rb") as fh:
            head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError:
        return False
    return head.startswith(b"[")


def parse_source(spec: str | Path) -> DataSource:
    """``--data`` as a :class:`DataSource`; UsageError for an unknown file type or a malformed hub id."""
    text = str(spec)
    if text.startswith(HF_PREFIX):
        match = _HF_ID.fullmatch(text[len(HF_PREFIX) :])
        if not match:
            raise UsageError(f"--data {text!r} is not a hub dataset id; write hf:ORG/NAME[:CONFIG][@SPLIT]")
        return DataSource(text, "hub", repo_id=match["repo"], config=match["config"], split=match["split"])
    path = Path(text)
    base, at, split = text.rpartition("@")
    if at and not path.exists() and Path(base).is_dir():
        return DataSource(text, "saved", path=Path(base), split=split or None)
    if path.is_dir():
        return DataSource(text, "saved", path=path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        known = ", ".join(sorted(FORMATS))
        raise UsageError(
            f"--data {text}: unknown file type {suffix or '(none)'!r}; use one of {known}, a saved dataset directory or hf:ORG/NAME"
        )
    return DataSource(text, "file", path=path, format=FORMATS[suffix])


def _quiet_datasets() -> Any:
    """Import ``datasets`` with its progress bars and logs off: a reader that fails logs its error before raising
    it (``Failed to read schema from ...``), and anchorlens reports every such failure as its own one line."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(logging.CRITICAL)
    logging.getLogger("datasets").setLevel(logging.CRITICAL)
    return datasets


def _one_line(err: BaseException) -> str:
    """An exception's message on one line, without library boilerplate."""
    text = " ".join(str(err).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def _open_file(source: DataSource) -> tuple[Any, str]:
    """A data file through ``datasets.load_dataset`` (its builder for the format), and its content's SHA-256 (first
    16 hex); OS errors name the file.

    The datasets cache keys a file's Arrow copy on its path and modification time only, so a file rewritten with
    its old time kept (``cp -p``, ``rsync -a``, ``tar x``) would be read from the stale copy: the copy anchorlens
    reads lives under the file's content digest instead."""
    assert source.path is not None and source.format is not None
    path = source.path
    with os_errors(path, "cannot read --data"):
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory", str(path))
        mode = path.stat().st_mode
    if not stat.S_ISREG(mode):  # a FIFO would block the read forever, a device never end
        raise DataError(
            f"cannot read --data {path}: not a regular file ({_file_kind(mode)}); write the data to a file and pass "
            "that"
        )
    digest = file_digest(path, "cannot read --data")
    if source.format in ("json", "csv", "text"):
        _check_text_file(path, source.format)
    if source.format == "json":
        from anchorlens.tasks.jsonl import check_nesting

        check_nesting(path)  # before a reader recurses into it
    datasets = _quiet_datasets()
    kwargs: dict[str, Any] = {}
    if source.format == "csv":
        sep = "\t" if path.suffix.lower() == ".tsv" else ","
        header = _check_csv_rows(path, sep)
        kwargs.update(sep=sep, **_csv_as_text(header, datasets))
    if source.format == "parquet":
        _check_parquet_columns(path)
    if source.format == "text":
        kwargs.update(sample_by="line", encoding="utf-8-sig")  # a byte-order mark is not the first document's text
    if path.stat().st_size == 0:
        raise DataError(f"{path}: no examples (the file is empty)")
    cache = Path(datasets_cache()) / "anchorlens" / digest
    table = datasets.load_dataset(source.format, data_files=str(path), split="train", cache_dir=str(cache), **kwargs)
    return table, digest


def _file_kind(mode: int) -> str:
    """What a path that is not a regular file is, in words."""
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a file"


def _check_parquet_columns(path: Path) -> None:
    """A parquet file has rows (the reader fails on none, saying nothing useful) and unique column names (it fails on
    a repeated one without naming it); a file that is not parquet is left to the reader's own error."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
    except Exception:  # noqa: BLE001 - not parquet: the reader says so
        return
    if meta.num_rows == 0:
        raise DataError(f"{path}: no examples (the parquet file has no rows)")
    names = meta.schema.to_arrow_schema().names
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise DataError(
            f"{path}: column {repeated[0]!r} appears {names.count(repeated[0])} times; give each column its own name"
        )


def _csv_as_text(header: list[str] | None, datasets: Any) -> dict[str, Any]:
    """Reader options that keep every CSV cell as the text it is: no type guessing (``007`` stays ``007``,
    ``3.10`` stays ``3.10``, ``True`` and ``None`` stay words) and only an empty cell is missing (``NA`` and
    ``null`` are text); the header names the columns as pandas would (an empty name is ``Unnamed: i``)."""
    if not header:
        return {}
    names = [name if name else f"Unnamed: {i}" for i, name in enumerate(header)]
    features = datasets.Features({name: datasets.Value("string") for name in names})
    return {"features": features, "keep_default_na": False, "na_values": [""]}


def _check_text_file(path: Path, fmt: str) -> None:
    """A text data file must be UTF-8 (the readers would keep bad bytes) and hold something; one line naming
    ``FILE:LINE``, the byte and its column otherwise. Streams the file; costs about one read of it."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    line, line_start, offset, blank = 1, 0, 0, True
    with os_errors(path, "cannot read --data"), path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            if offset == 0 and chunk.startswith(b"\xef\xbb\xbf"):
                chunk, offset, line_start = chunk[3:], 3, 3
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as err:
                head = chunk[: err.start]
                line += head.count(b"\n")
                start = offset + head.rfind(b"\n") + 1 if b"\n" in head else line_start
                bad = chunk[err.start]
                column = offset + err.start - start + 1
                raise DataError(
                    f"{path}:{line}: not UTF-8 (byte 0x{bad:02x} at column {column}); re-encode the file as UTF-8"
                ) from None
            blank = blank and not chunk.strip()
            newlines = chunk.count(b"\n")
            if newlines:
                line += newlines
                line_start = offset + chunk.rfind(b"\n") + 1
            offset += len(chunk)
    if blank:
        raise DataError(f"{path}: no examples (the file is empty)")


def _check_csv_rows(path: Path, sep: str) -> list[str] | None:
    """The header of a CSV/TSV file (None: no header) once every record has its number of columns (the reader
    would fill a short row with missing values, or fail without naming the line) and its names are unique (the
    reader would rename a repeated one ``name.1`` and drop it from the task's fields); one line naming the row,
    its line and the fix otherwise. Streams the file; rows are numbered like the readers' (blank lines skipped,
    the header not counted)."""
    import csv

    limit = csv.field_size_limit()
    csv.field_size_limit(2**31 - 1)  # documents longer than csv's default 128 KiB field
    try:
        with os_errors(path, "cannot read --data"), path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh, delimiter=sep, strict=True)
            try:
                header = next((r for r in reader if r), None)
            except csv.Error as err:
                raise DataError(_bad_quote(path, 0, 1, err)) from None
            if header is None:
                return None
            repeated = sorted({name for name in header if name and header.count(name) > 1})
            if repeated:
                raise DataError(
                    f"{path}: the header names column {repeated[0]!r} {header.count(repeated[0])} times; give each "
                    "column its own name"
                )
            row, end = 0, reader.line_num
            while True:
                try:
                    record = next(reader, None)
                except csv.Error as err:
                    start = _first_full_line(path, end)
                    runs_to = reader.line_num if reader.line_num > start else 0
                    raise DataError(_bad_quote(path, row + 1, start, err, runs_to)) from None
                if record is None:
                    break
                start, end = end + 1, reader.line_num
                if not record:
                    continue
                row += 1
                if end > start and len(record) != len(header):  # a quote left open swallowed the next lines
                    start = _first_full_line(path, start - 1)
                    raise DataError(_bad_quote(path, row, start, runs_to=end))
                if len(record) < len(header):
                    lacking = ", ".join(header[len(record) :])
                    raise DataError(
                        f"{path}: row {row:,} (line {reader.line_num:,}) has {len(record)} of the header's "
                        f"{len(header)} columns ({lacking} missing); complete the row or leave the cell empty"
                    )
                if len(record) > len(header):
                    what = "a tab" if sep == "\t" else f"a {sep!r}"
                    raise DataError(
                        f"{path}: row {row:,} (line {reader.line_num:,}) has {len(record)} columns, the header "
                        f"{len(header)}; quote the field that holds {what} or add the column to the header"
                    )
    finally:
        csv.field_size_limit(limit)
    return header


def _first_full_line(path: Path, after: int) -> int:
    """The 1-based number of the first non-blank line after line ``after`` (where the next record starts)."""
    with path.open(newline="", encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, start=1):
            if lineno > after and line.strip("\r\n"):
                return lineno
    return after + 1


def _bad_quote(path: Path, row: int, line: int, err: Exception | None = None, runs_to: int = 0) -> str:
    """One line for a record whose quoting is broken: a field that opens a quote it never closes (the reader would
    merge the rows after it into this one) or closes it before more text. ``row`` 0 is the header."""
    where = "the header" if row == 0 else f"row {row:,}"
    if err is not None and "end of data" not in str(err) and '"' not in str(err):  # not a quote: NUL bytes...
        return (
            f"{path}: {where} (line {line:,}) is not readable CSV ({_one_line(err)}); fix the row or use --data "
            "FILE.jsonl"
        )
    if err is not None and "end of data" in str(err):
        problem = "opens a quoted field that is never closed (the rows after it would merge into it)"
    elif runs_to:
        problem = f"opens a quoted field that runs on to line {runs_to:,}, merging the rows between into one"
    else:
        problem = 'has a field that starts with a quote (") and goes on after its closing quote'
    return (
        f'{path}: {where} (line {line:,}) {problem}; escape a quote inside a field by doubling it ("") and quote '
        "the whole field, or use --data FILE.jsonl"
    )


def _pick_split(loaded: Any, source: DataSource, where: str) -> Any:
    """One split of a DatasetDict: the one named, else ``train`` or the only one; UsageError lists the splits."""
    if not hasattr(loaded, "keys"):
        if source.split is not None:
            raise UsageError(f"{where} holds one dataset, not splits; drop @{source.split}")
        return loaded
    splits = list(loaded.keys())
    if source.split is not None:
        if source.split not in splits:
            raise UsageError(f"{where} has no split {source.split!r}; splits: {', '.join(splits)}")
        return loaded[source.split]
    if len(splits) == 1:
        return loaded[splits[0]]
    if "train" in splits:
        return loaded["train"]
    raise UsageError(f"{where} has splits {', '.join(splits)}; name one: {source.spec}@{splits[0]}")


def _open_saved(source: DataSource) -> Any:
    """A directory written by ``save_to_disk`` (a Dataset or a DatasetDict)."""
    assert source.path is not None
    path = source.path
    marks = ("dataset_info.json", "state.json", "dataset_dict.json")
    if not any((path / m).is_file() for m in marks):
        raise DataError(
            f"cannot read --data {path}: is a directory, not a dataset written by datasets.save_to_disk "
            "(no dataset_info.json or dataset_dict.json); pass a data file or the saved dataset's directory"
        )
    datasets = _quiet_datasets()
    with os_errors(path, "cannot read --data"):
        loaded = datasets.load_from_disk(str(path))
    return _pick_split(loaded, source, str(path))


def _open_hub(source: DataSource) -> tuple[Any, dict[str, Any]]:
    """A hub dataset from the local HF cache (no network): the snapshot's files, loaded by ``datasets``."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    assert source.repo_id is not None
    try:
        folder = Path(snapshot_download(source.repo_id, repo_type="dataset", local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        raise DataError(
            f"hub dataset {source.repo_id} is not in the local HF cache ({_hub_cache()}); fetch it once with "
            f"`hf download {source.repo_id} --repo-type dataset` (anchorlens reads datasets offline)"
        ) from None
    datasets = _quiet_datasets()
    config = source.config
    kwargs: dict[str, Any] = {}
    if config is not None:
        kwargs = {"data_dir": config} if (folder / config).is_dir() else {"name": config}
    try:
        loaded = datasets.load_dataset(str(folder), **kwargs)
    except (ValueError, FileNotFoundError) as err:
        raise DataError(f"--data {source.spec}: {_one_line(err)}") from None
    facts = {"repo_id": source.repo_id, "config": config, "revision": folder.name, "path": str(folder)}
    return _pick_split(loaded, source, source.spec), facts


def _hub_cache() -> str:
    """The HF hub cache huggingface_hub reads now."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def open_source(source: DataSource) -> OpenedData:
    """Open ``source`` as a ``datasets.Dataset``; every failure is one line naming the file and the problem."""
    facts: dict[str, Any] = {"data": source.spec, "kind": source.kind}
    digest = None
    try:
        if source.kind == "hub":
            table, hub = _open_hub(source)
            facts.update(hub)
        elif source.kind == "saved":
            table = _open_saved(source)
        else:
            table, digest = _open_file(source)
    except (UsageError, PathError):
        raise
    except Exception as err:  # the readers' own errors (pyarrow, pandas, json) for a malformed file
        raise DataError(_describe_failure(source, err)) from None
    facts["rows"] = int(table.num_rows)
    facts["split"] = getattr(table, "split", None) and str(table.split)
    return OpenedData(source, table, facts, digest)


def _describe_failure(source: DataSource, err: BaseException) -> str:
    """One line for a reader's failure: for jsonl the precise ``FILE:LINE`` problem when a scan finds it."""
    where = source.spec if source.path is None else str(source.path)
    if "corresponds to no data" in str(err):  # the reader produced no row (a CSV with only its header...)
        return f"{where}: no examples (the file is empty)"
    if source.kind == "file" and source.format == "json" and source.path is not None:
        from anchorlens.tasks.jsonl import scan_json_lines

        found = scan_json_lines(source.path)
        if found:
            return found
    if source.format == "parquet":
        return f"{where}: not a parquet file ({_one_line(err)}); check the file or its extension"
    if source.format == "csv":
        return f"{where}: not a readable CSV/TSV file ({_one_line(err)})"
    return f"{where}: cannot read the data ({_one_line(err)})"


def datasets_cache() -> str:
    """The folder HF datasets writes its Arrow copies to."""
    return os.environ.get("HF_DATASETS_CACHE") or str(Path.home() / ".cache" / "huggingface" / "datasets")
