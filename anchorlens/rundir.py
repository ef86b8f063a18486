"""Output directories: claim an ``--out`` once, write results atomically, record a manifest.

Every command that writes (compare, capture, evaluate, positions, sweeps, train, figures) starts
with :func:`claim_out`, before any computation. The claim

- refuses an ``--out`` that is the current directory, one of its parents or ``/``; a path under a
  file or an unwritable parent; an ``--out`` that is or holds one of the command's
  inputs (``inputs``: a checkpoint or base directory, a data file; see :func:`check_inputs`); an
  existing finished run unless ``force``; and a non-empty directory that anchorlens did not write
  (no manifest, no progress marker) even with ``force``;
- under ``force``, refuses a run folder that also holds entries anchorlens did not write (the user's
  notes, an analysis folder): ``--force`` replaces only what anchorlens wrote (see :func:`stray_entry`);
- holds an exclusive ``fcntl.flock`` on ``.OUT.anchorlens-lock`` beside ``OUT`` (owner pid/host
  recorded inside) for the whole run, so a second run into the same ``OUT`` is refused before it
  computes anything. The kernel drops the lock when its owner dies, so a killed run's claim is
  taken over by the next one.

Whole-folder results are written with :meth:`OutClaim.atomic` (a temp sibling renamed into place,
umask modes, see :func:`anchorlens.atomic.atomic_dir`); resumable runs (capture progress, training
checkpoints) write inside ``OUT`` between :meth:`OutClaim.start_in_place` and
:meth:`OutClaim.finish_in_place`, whose ``manifest.json`` is the commit marker.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, Protocol

from anchorlens.atomic import (
    OWNER_FILE,
    TEMP_MARK,
    atomic_dir,
    clean_stale_temps,
    os_errors,
    owner_record,
    scratch_dir,
    write_json,
)
from anchorlens.errors import PathError, UsageError

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "anchorlens-run/1"
RUN_MARKER = ".anchorlens-run.json"  # an unfinished in-place run (capture, train): "anchorlens wrote this"
PROGRESS_DIR = ".progress"  # capture's resumable chunk states (anchorlens.runtime.shards)
CHECKPOINTS = "checkpoints"  # training's step checkpoints (anchorlens.training.checkpointing)
LOCK_SUFFIX = ".anchorlens-lock"
FILES_KEY = "files"  # the manifest's list of the top-level entries the run wrote (recorded by OutClaim.atomic)
# Every top-level entry some anchorlens command writes in its OUT (compare, capture, evaluate, positions, sweeps,
# demo, train, reproduce, figures): what a run folder may hold when its manifest does not list its own entries
# (in-place runs: capture, train, reproduce; runs of earlier versions; unfinished runs).
RUN_ENTRIES = frozenset(
    {
        MANIFEST, RUN_MARKER, PROGRESS_DIR, CHECKPOINTS, "final", "runs", "cells", "tables", "figures",
        "metrics.parquet", "metrics.csv", "metrics.json", "effects.parquet", "effects.csv", "facts.json",
        "headline.csv", "paired.csv", "task_effects.csv", "accuracy_pairs.csv", "evidence.csv", "maps.json", "maps.safetensors",
        "summary.md", "summary.json", "report.html", "predictions.csv", "positions.csv", "sweep.csv",
        "per_layer.csv", "attention_budget.png", "history.csv",
    }
)  # fmt: skip
FIGURE_SUFFIXES = frozenset({".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp"})

RunState = Literal["absent", "unfinished", "finished", "foreign"]


# ---------------------------------------------------------------------------- what is in OUT
def is_manifest(path: Path) -> bool:
    """Whether ``path`` is a manifest written by anchorlens (this format or the earlier one)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(obj, dict):
        return False
    versions = obj.get("versions")
    return obj.get("format") == MANIFEST_FORMAT or (isinstance(versions, dict) and "anchorlens" in versions)


def _has_progress(path: Path) -> bool:
    """Whether ``path`` holds a marker of an unfinished anchorlens run (run marker, capture progress, checkpoints)."""
    if (path / RUN_MARKER).is_file() or (path / PROGRESS_DIR / "run.json").is_file():
        return True
    ckpts = path / CHECKPOINTS
    return ckpts.is_dir() and any((c / "trainer_state.json").is_file() for c in ckpts.iterdir())


def run_kind(path: Path) -> str | None:
    """The ``kind`` an anchorlens run in ``path`` recorded (manifest or run marker), None when unknown."""
    for record in (path / MANIFEST, path / RUN_MARKER):
        try:
            obj = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if isinstance(kind, str):
            return kind
    return None


def run_state(path: str | Path) -> RunState:
    """What ``path`` holds: nothing, an unfinished or finished anchorlens run, or something else (foreign).

    A ``figures`` folder inside a finished run counts as that run's (compare wrote it there).
    """
    path = Path(path)
    if not path.is_dir() and not path.exists():
        return "absent"
    if not path.is_dir():
        return "foreign"
    if is_manifest(path / MANIFEST) or (path.name == "figures" and is_manifest(path.parent / MANIFEST)):
        return "finished"
    if _has_progress(path):
        return "unfinished"
    return "foreign" if any(path.iterdir()) else "absent"


def _internal(name: str) -> bool:
    """Whether ``name`` is anchorlens bookkeeping inside any run folder (its temp files, an owner record)."""
    return TEMP_MARK in name or name == OWNER_FILE


def _own_entries(path: Path) -> frozenset[str] | None:
    """The top-level names the run in ``path`` wrote: its manifest's list; None when it records none."""
    try:
        obj = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = obj.get(FILES_KEY) if isinstance(obj, dict) else None
    if isinstance(files, list) and all(isinstance(f, str) for f in files):
        return frozenset(files) | {MANIFEST}
    return None


def _names(path: Path) -> list[str]:
    """The entries of ``path`` by name, without anchorlens bookkeeping (none when it cannot be listed)."""
    try:
        return sorted(p.name for p in path.iterdir() if not _internal(p.name))
    except OSError:
        return []


def _stray_figure(folder: Path) -> str | None:
    """The first entry of a figures folder that is neither a figure file nor its manifest."""
    return next((n for n in _names(folder) if n != MANIFEST and Path(n).suffix.lower() not in FIGURE_SUFFIXES), None)


def stray_entry(path: str | Path) -> str | None:
    """The first entry (by name) of the anchorlens run in ``path`` that the run did not write; None when none.

    A run folder is the run's own when every top-level entry is one the run recorded in its manifest
    (``files``), or, for runs that record none (in-place runs, earlier versions, unfinished runs), one that
    some anchorlens command writes (:data:`RUN_ENTRIES`); a ``figures`` folder holds only figure files.

    Why refuse rather than keep them: ``--force`` promises to replace a run, never what the user wrote.
    Deleting the user's notes breaks that promise; keeping them beside the new results would leave notes
    and scripts about the old results silently mixed in with new ones. Refusing, before any work, with the
    entry to move, loses nothing and leaves the choice to the user.
    """
    path = Path(path)
    names = _names(path)
    own = _own_entries(path)
    if own is None and path.name == "figures":
        return _stray_figure(path)
    allowed = RUN_ENTRIES if own is None else own | {RUN_MARKER, PROGRESS_DIR}
    stray = next((n for n in names if n not in allowed), None)
    if stray is None and "figures" in names and (path / "figures").is_dir():
        inner = _stray_figure(path / "figures")
        stray = None if inner is None else f"figures/{inner}"
    return stray


def _stray_error(target: Path, stray: str) -> UsageError:
    """The refusal for a run folder holding an entry anchorlens did not write."""
    return UsageError(
        f"{target} holds {stray}, which anchorlens did not write; --force replaces only what anchorlens wrote: "
        f"move {stray} out of {target}, or choose another --out"
    )


# ---------------------------------------------------------------------------- the command's inputs
def local_paths(value: str | Path | None) -> list[Path]:
    """The existing local files and folders an input argument names (absolute, resolved).

    ``value`` is a path, a checkpoint spec (``DIR``, ``DIR:merge=true``, ``model=DIR``, parts joined by
    ``+``) or a dataset (``DIR@SPLIT``); names that are not on disk (``base``, ``capsule``, hub ids,
    ``hf:...``, ``tiny-llama``) give nothing.
    """
    if value is None:
        return []
    text = str(value).strip()
    candidates = {text, text.rpartition("@")[0]}
    for part in text.split("+"):
        part = part.strip()
        for item in (part, part.removeprefix("model=")):
            candidates.update({item, item.partition(":")[0], item.rpartition("@")[0]})
    found: dict[Path, None] = {}
    for candidate in sorted(c for c in candidates if c):
        path = Path(candidate).expanduser()
        if path.exists():
            found[path.resolve()] = None
    return list(found)


def check_inputs(out: str | Path, inputs: Iterable[str | Path | None]) -> None:
    """Refuse an ``--out`` that is or holds one of ``inputs`` (UsageError, one line).

    anchorlens replaces its ``--out`` as a whole (``--force``), so such an ``--out`` would delete what the
    command reads: a checkpoint (``--ckpt ckq/final --out ckq``), a local base directory, a data file. An
    ``--out`` inside an input folder (``--base . --out runs/x`` in the model's own folder) deletes nothing of it.
    """
    target = Path(out).expanduser().resolve()
    for value in inputs:
        for path in local_paths(value):
            if target == path:
                relation = "is"
            elif target in path.parents:
                relation = "holds"
            else:
                continue
            named = str(value) if Path(str(value)).expanduser().resolve() == path else f"{value} ({path})"
            raise UsageError(
                f"--out {out} {relation} the input {named}; anchorlens replaces its --out as a whole, which "
                "would delete or alter that input: choose an --out outside the command's inputs, e.g. --out runs/NAME"
            )


# ---------------------------------------------------------------------------- up-front checks
def _check_location(target: Path) -> None:
    """Refuse the cwd / its parents / ``/``, a file, a path under a file, an unwritable parent (reads only)."""
    resolved = target.resolve()
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents or resolved == Path(resolved.anchor):
        raise UsageError(
            f"--out {target} is the current directory or one of its parents; anchorlens replaces "
            "its --out as a whole: choose a new folder, e.g. --out runs/NAME"
        )
    if target.exists() and not target.is_dir():
        raise PathError(f"--out {target} exists and is not a directory; choose another --out")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise PathError(f"cannot write {target}: {parent} is a file, not a directory; choose another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PathError(f"cannot write {target}: {parent} is not writable (permission denied); choose another --out")


def _check_state(target: Path, state: RunState, *, kind: str, force: bool, resume: bool) -> None:
    """Refuse what the claim may not replace or continue."""
    if state == "foreign":
        raise UsageError(
            f"{target} is not empty and holds no anchorlens run (no {MANIFEST} or progress); --force "
            "replaces only what anchorlens wrote: choose another --out or empty it yourself"
        )
    if state == "finished" and not (force or resume):
        raise UsageError(
            f"{target} already exists and holds a finished run; pass --force to replace it or choose another --out"
        )
    if state == "unfinished" and not (force or resume):
        raise UsageError(
            f"{target} holds an unfinished anchorlens run; pass --resume to continue it, --force to "
            "replace it, or choose another --out"
        )
    if force and state in ("finished", "unfinished"):
        stray = stray_entry(target)
        if stray is not None:
            raise _stray_error(target, stray)
    found = run_kind(target) if state in ("finished", "unfinished") else None
    if resume and not force and found is not None and found != kind:
        raise UsageError(
            f"{target} holds a {found} run, not a {kind} run; it cannot be continued: choose another "
            "--out (or --force to replace it)"
        )


# ---------------------------------------------------------------------------- the lock
def lock_path(target: Path) -> Path:
    """The lock file beside ``target``: ``.NAME.anchorlens-lock``."""
    return target.parent / f".{target.name}{LOCK_SUFFIX}"


def _busy(target: Path, fd: int) -> UsageError:
    """The refusal for an ``OUT`` another live run holds (names it when its record is readable)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        owner = json.loads(os.read(fd, 4096) or b"{}")
    except (OSError, ValueError):
        owner = {}
    who = f" (pid {owner.get('pid')} on {owner.get('host')})" if isinstance(owner, dict) and owner.get("pid") else ""
    return UsageError(
        f"{target} is being written by another anchorlens run{who}; wait for it to finish or choose another --out"
    )


def _acquire(target: Path) -> int:
    """Take the exclusive lock of ``target`` without waiting; returns its fd (UsageError when held)."""
    lock = lock_path(target)
    with os_errors(lock, "cannot claim"):
        for _ in range(10):
            if lock.is_symlink():  # never write through a link planted where the lock goes
                raise PathError(f"cannot claim {target}: its lock file {lock} is a symbolic link; remove it and rerun")
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                err = _busy(target, fd)
                os.close(fd)
                raise err from None
            try:
                same = os.stat(lock).st_ino == os.fstat(fd).st_ino  # a releaser may have unlinked it meanwhile
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps(owner_record()).encode())
                return fd
            os.close(fd)
    raise PathError(f"cannot claim {target}: its lock file {lock} keeps changing; retry")


# ---------------------------------------------------------------------------- the claim
@dataclass
class OutClaim:
    """An exclusive claim on one ``--out``, held until :meth:`release` (or the end of a ``with``)."""

    path: Path
    kind: str
    state: RunState  # what OUT held when claimed
    force: bool = False
    _fd: int | None = field(default=None, repr=False)

    def __enter__(self) -> OutClaim:
        """The claim itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Release the claim."""
        self.release()

    @property
    def held(self) -> bool:
        """Whether this claim still holds its lock."""
        return self._fd is not None

    def release(self) -> None:
        """Drop the lock and remove its file (idempotent)."""
        if self._fd is None:
            return
        try:
            lock_path(self.path).unlink(missing_ok=True)  # under the lock: the next claimant re-checks the inode
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def _may_replace(self, target: Path) -> bool:
        """At rename time: replace only an empty dir or an anchorlens run holding nothing else (re-checked: the
        user may have written since)."""
        return run_state(target) != "foreign" and stray_entry(target) is None

    @contextmanager
    def atomic(self) -> Iterator[Path]:
        """Yield a temp folder to fill; on success it replaces ``OUT`` whole, on error nothing is left.

        When the folder holds a manifest, its ``files`` records the entries written, so that a later
        ``--force`` knows exactly which entries are the run's own (:func:`stray_entry`)."""
        if not self.held:
            raise RuntimeError(f"the claim on {self.path} was released before writing")
        with (
            atomic_dir(self.path, replace=self._may_replace) as tmp,
            os_errors(self.path, "cannot write", name_path=True),
        ):
            yield tmp  # a full disk or quota while filling it: one line naming OUT, nothing left behind
            _record_entries(tmp)

    @contextmanager
    def scratch(self) -> Iterator[Path]:
        """A temp folder beside ``OUT`` for intermediate files (removed at the end, or by the next run if killed)."""
        with scratch_dir(self.path) as tmp:
            yield tmp

    def start_in_place(self, facts: dict[str, Any] | None = None) -> Path:
        """Make ``OUT`` ready for an in-place run: cleared under ``force``, run marker written, stale temps removed."""
        with os_errors(self.path, "cannot write"):
            if self.force and self.state in ("finished", "unfinished"):
                clear_run(self.path)
                self.state = "absent"
            self.path.mkdir(parents=True, exist_ok=True)
            clean_stale_temps(self.path.parent, self.path.name)
            if not (self.path / MANIFEST).exists():
                write_json(self.path / RUN_MARKER, {"kind": self.kind, **owner_record(), **(facts or {})})
        return self.path

    def discard_if_empty(self) -> bool:
        """After a failed in-place run: remove ``OUT`` when this claim created it and nothing resumable is in it."""
        if self.state != "absent" or not self.path.is_dir():
            return False
        keep = {RUN_MARKER, f"{PROGRESS_DIR}/run.json"}
        files = [p.relative_to(self.path).as_posix() for p in self.path.rglob("*") if not p.is_dir()]
        if any(f not in keep for f in files):
            return False
        shutil.rmtree(self.path, ignore_errors=True)
        return True

    def finish_in_place(self, record: dict[str, Any]) -> Path:
        """Write ``OUT/manifest.json`` (the commit marker of an in-place run) and drop the run marker."""
        path = write_json(self.path / MANIFEST, record)
        (self.path / RUN_MARKER).unlink(missing_ok=True)
        return path


def _record_entries(folder: Path) -> None:
    """Add the top-level entries of ``folder`` to its anchorlens manifest (when it has one)."""
    record = folder / MANIFEST
    if not is_manifest(record):
        return
    obj = json.loads(record.read_text())
    obj[FILES_KEY] = sorted(p.name for p in folder.iterdir() if not _internal(p.name))
    write_json(record, obj)


def clear_run(path: Path) -> None:
    """Remove an anchorlens run folder (refuses anything else: ``--force`` replaces only what anchorlens wrote,
    so a run folder that also holds the user's entries is refused too, see :func:`stray_entry`)."""
    if run_state(path) == "foreign":
        raise UsageError(f"{path} holds no anchorlens run; refusing to delete it")
    stray = stray_entry(path)
    if stray is not None:
        raise _stray_error(path, stray)
    aside = path.with_name(f".{path.name}{TEMP_MARK}old-{os.getpid()}")
    with os_errors(path, "cannot replace"):
        path.rename(aside)
        shutil.rmtree(aside)


def claim_out(
    path: str | Path,
    *,
    kind: str,
    force: bool = False,
    resume: bool = False,
    inputs: Iterable[str | Path | None] = (),
) -> OutClaim:
    """Claim ``path`` as the ``--out`` of a ``kind`` run before computing anything (see the module doc).

    ``resume``: an existing anchorlens run (finished or not) may be continued in place. ``force``:
    an existing anchorlens run may be replaced, when it holds nothing anchorlens did not write. A
    foreign non-empty directory is refused either way. ``inputs``: what the command reads (checkpoint
    specs, base, data files); an ``--out`` that is or holds one is refused
    (:func:`check_inputs`). Raises UsageError / PathError (one line, exit 2).
    """
    target = Path(os.path.realpath(Path(path).expanduser()))  # one lock per folder, however a link names it
    _check_location(target)
    check_inputs(path, inputs)
    with os_errors(target.parent, "cannot create"):
        target.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(target)
    try:
        state = run_state(target)
        _check_state(target, state, kind=kind, force=force, resume=resume)
    except BaseException:
        lock_path(target).unlink(missing_ok=True)
        os.close(fd)
        raise
    return OutClaim(target, kind, state, force, fd)


def as_claim(
    out: str | Path | OutClaim,
    *,
    kind: str,
    force: bool = False,
    resume: bool = False,
    inputs: Iterable[str | Path | None] = (),
) -> OutClaim:
    """``out`` when it is already a claim, else :func:`claim_out` on it (the caller then releases it)."""
    if isinstance(out, OutClaim):
        return out
    return claim_out(out, kind=kind, force=force, resume=resume, inputs=inputs)


@contextmanager
def claimed(
    out: str | Path | OutClaim,
    *,
    kind: str,
    force: bool = False,
    resume: bool = False,
    inputs: Iterable[str | Path | None] = (),
) -> Iterator[OutClaim]:
    """:func:`as_claim` for a ``with`` block: a claim made here is released at its end, a given one is kept."""
    claim = as_claim(out, kind=kind, force=force, resume=resume, inputs=inputs)
    try:
        yield claim
    finally:
        if claim is not out:
            claim.release()


# ---------------------------------------------------------------------------- manifests
class _HasBase(Protocol):
    """What a manifest reads from a base model."""

    spec: str

    def fingerprint(self) -> Any:
        """Architecture/weights fingerprint."""


def base_facts(base: _HasBase) -> dict[str, Any]:
    """Spec, fingerprint and (when the Base offers it) provenance of a base model."""
    facts: dict[str, Any] = {"spec": base.spec, "fingerprint": base.fingerprint()}
    provenance = getattr(base, "provenance", None)
    if callable(provenance):
        facts["provenance"] = provenance()
    return facts


def _version(dist: str) -> str:
    """Installed version of ``dist`` ("absent" when not installed)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def manifest(
    kind: str,
    *,
    base_model: _HasBase | None = None,
    data_digest: str | None = None,
    seed: int | None = None,
    **facts: Any,
) -> dict[str, Any]:
    """Provenance of a run: kind, command line, versions, time, base facts, data digest, seed, plus ``facts``."""
    record: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "kind": kind,
        "command": sys.argv,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "versions": {d: _version(d) for d in ("anchorlens", "torch", "transformers", "numpy", "pandas")},
    }
    if base_model is not None:
        record["base_model"] = base_facts(base_model)
    if data_digest is not None:
        record["data_digest"] = data_digest
    if seed is not None:
        record["seed"] = seed
    record.update(facts)
    return record


def write_manifest(folder: Path, kind: str, **kwargs: Any) -> Path:
    """Write ``folder/manifest.json`` from :func:`manifest` (atomically)."""
    return write_json(folder / MANIFEST, manifest(kind, **kwargs))


# ---------------------------------------------------------------------------- digests
def file_digest(path: str | Path, action: str = "cannot read") -> str:
    """SHA-256 (first 16 hex) of a file; an OS error is one line starting with ``action``."""
    h = hashlib.sha256()
    with os_errors(path, action), open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def examples_digest(examples: Any) -> str:
    """SHA-256 (first 16 hex) of the examples: their own ``digest()`` when they have one (examples read from a
    file: its content and the selection), else the examples as canonical JSON."""
    own = getattr(examples, "digest", None)
    if callable(own):
        return str(own())
    blob = json.dumps(list(examples), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
