"""Atomic writes: files and directories appear whole or not at all, with the user's umask.

Every writer in anchorlens goes through here (run folders, checkpoints, shards, training state,
the model cache). A temporary directory records its owner (pid, host) so a later run can remove
the leftovers of a killed one (:func:`clean_stale_temps`). OS errors become one-line
:class:`~anchorlens.errors.PathError` messages naming the path (:func:`os_errors`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from anchorlens.errors import PathError

OWNER_FILE = ".anchorlens-owner.json"
TEMP_MARK = ".anchorlens-tmp-"


def current_umask() -> int:
    """The process umask (read without changing it for longer than a call)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _reason(err: OSError) -> str:
    """A short reason for an OS error."""
    if err.errno == errno.ENOSPC:
        return "no space left on the device"
    if err.errno == errno.EDQUOT:
        return "disk quota exceeded"
    if isinstance(err, PermissionError):
        return "permission denied"
    if isinstance(err, NotADirectoryError):
        return "a parent is a file, not a directory"
    if isinstance(err, FileNotFoundError):
        return "no such file or directory"
    if isinstance(err, IsADirectoryError):
        return "is a directory"
    return err.strerror or type(err).__name__


@contextmanager
def os_errors(path: str | Path, what: str = "", hint: str = "", *, name_path: bool = False) -> Iterator[None]:
    """Turn any OSError raised inside the block into a one-line PathError naming ``path``.

    The message names the file the error was about, or ``path`` when ``name_path`` (e.g. a temp file's
    final destination) or when the error names none.
    """
    try:
        yield
    except PathError:
        raise
    except OSError as err:
        where = path if name_path else (err.filename or path)
        label = f"{what} {where}" if what else str(where)
        raise PathError(f"{label}: {_reason(err)}" + (f"; {hint}" if hint else "")) from None


def _apply_umask(path: Path, directory: bool) -> None:
    """Give ``path`` the mode a plain create would have had under the umask (mkstemp/mkdtemp use 0600/0700)."""
    mode = (0o777 if directory else 0o666) & ~current_umask()
    os.chmod(path, mode)


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` on a temp sibling, then rename it over ``path`` (readers never see half a file)."""
    path = Path(path)
    with os_errors(path, "cannot write"):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARK}", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        try:
            write(tmp)
            _apply_umask(tmp, directory=False)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` atomically."""
    return atomic_write(path, lambda p: p.write_bytes(data))


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` atomically."""
    return atomic_write(path, lambda p: p.write_text(text))


def write_json(path: str | Path, obj: Any, *, sort_keys: bool = False) -> Path:
    """Write ``obj`` as indented JSON atomically (values JSON cannot hold are written as strings)."""
    return write_text(path, json.dumps(obj, indent=2, sort_keys=sort_keys, default=str) + "\n")


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` runs on this host (a zombie, dead but not yet reaped, counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def owner_record() -> dict[str, Any]:
    """Who is writing: pid, host and start time."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}


def owner_alive(record: dict[str, Any] | None) -> bool:
    """Whether the writer of ``record`` may still be running (unknown hosts count as alive)."""
    if not isinstance(record, dict):
        return False
    if record.get("host") != socket.gethostname():
        return True
    pid = record.get("pid")
    return isinstance(pid, int) and pid_alive(pid)


def read_owner(directory: Path) -> dict[str, Any] | None:
    """The owner record inside ``directory``, or None when absent or unreadable."""
    try:
        obj = json.loads((directory / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def clean_stale_temps(parent: Path, name: str | None = None, *, max_age_s: float = 24 * 3600) -> list[Path]:
    """Remove temp files/dirs (of ``name``, or any) under ``parent`` left by writers that died; returns them.

    A temp dir is stale when its owner record names a dead process on this host, or when it has no
    record and is older than ``max_age_s``; a temp file when it is older than ``max_age_s``.
    """
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    prefix = f".{name}{TEMP_MARK}" if name else "."
    for child in parent.iterdir():
        if not child.name.startswith(prefix) or TEMP_MARK not in child.name:
            continue
        try:
            age = time.time() - child.lstat().st_mtime
            if child.is_dir() and not child.is_symlink():
                record = read_owner(child)
                if (record is not None and not owner_alive(record)) or (record is None and age > max_age_s):
                    shutil.rmtree(child, ignore_errors=True)
                    removed.append(child)
            elif age > max_age_s:
                child.unlink(missing_ok=True)
                removed.append(child)
        except OSError:
            continue
    return removed


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename ``src`` over ``dst``; an existing ``dst`` is moved aside first and deleted after."""
    old = None
    if dst.exists() or dst.is_symlink():
        old = dst.with_name(f".{dst.name}{TEMP_MARK}old-{os.getpid()}-{time.time_ns()}")
        dst.rename(old)
    src.rename(dst)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def apply_umask_tree(root: Path) -> None:
    """Give ``root`` and everything under it the umask's modes (safetensors and mkstemp write 0600, mkdtemp 0700)."""
    _apply_umask(root, directory=True)
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            _apply_umask(Path(folder) / name, directory=True)
        for name in files:
            path = Path(folder) / name
            if not path.is_symlink():
                executable = path.stat().st_mode & 0o111
                os.chmod(path, (0o777 if executable else 0o666) & ~current_umask())


def owned_temp_dir(target: Path) -> Path:
    """A new temp dir ``.NAME.anchorlens-tmp-XXXX`` beside ``target`` recording its owner (stale ones removed first)."""
    with os_errors(target, "cannot write"):
        target.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(target.parent, target.name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}{TEMP_MARK}", dir=target.parent))
        (tmp / OWNER_FILE).write_text(json.dumps(owner_record()))
    return tmp


@contextmanager
def scratch_dir(target: str | Path) -> Iterator[Path]:
    """An owner-recorded temp dir beside ``target`` for intermediate files, removed at the end (or by the next run)."""
    tmp = owned_temp_dir(Path(target))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic_dir(path: str | Path, *, replace: bool | Callable[[Path], bool] = False) -> Iterator[Path]:
    """Yield a temp dir beside ``path`` to fill; on success it is renamed to ``path``, on error removed.

    The temp dir records its owner so :func:`clean_stale_temps` can remove it if this process is
    killed. ``replace``: whether an existing ``path`` may be replaced (a callable decides at rename
    time); when it may not, the result is kept in a sibling ``NAME.kept-TIME`` and a PathError says
    so. The result, and everything in it, gets the umask's modes.
    """
    target = Path(path)
    tmp = owned_temp_dir(target)
    try:
        yield tmp
        with os_errors(target, "cannot write"):
            (tmp / OWNER_FILE).unlink(missing_ok=True)
            apply_umask_tree(tmp)
            exists = target.exists() or target.is_symlink()
            if exists and not (replace(target) if callable(replace) else replace):
                kept = target.with_name(f"{target.name}.kept-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
                tmp.rename(kept)
                raise PathError(
                    f"{target} was changed by someone else while this run was writing; "
                    f"this run's result is kept in {kept}"
                )
            _replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
