"""Feedback on long work: one stage reporter for every step that takes more than a second.

``with stage("capturing base", total=24) as s: ... s.update(8)`` shows a tqdm bar when stderr is a
terminal and the total is known; otherwise it writes plain lines, rate-limited (a start line, at most one progress line
every ``every_s`` seconds, and a ``done`` line with the elapsed seconds), so logs of batch jobs and
CI show where the time goes without one line per batch. Layer 0: no anchorlens imports.
"""
from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import IO, Any

DEFAULT_EVERY_S = 10.0


def _is_terminal(stream: IO[str]) -> bool:
    """Whether ``stream`` is an interactive terminal."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):
        return False


def _format_seconds(seconds: float) -> str:
    """``3.2s``, ``95s``, ``12m05s``."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 600:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s"


class Stage:
    """One named stage of work with an optional item count; see :func:`stage`."""

    def __init__(self, name: str, total: int | None = None, *, unit: str = "ex", stream: IO[str] | None = None,
                 enabled: bool = True, every_s: float = DEFAULT_EVERY_S, bar: bool | None = None) -> None:
        """Start the stage now (prints the start line or opens the bar)."""
        self.name, self.total, self.unit = name, total, unit
        self.stream = sys.stderr if stream is None else stream
        self.enabled, self.every_s = enabled, every_s
        self.count = 0
        self.started = self._last = time.monotonic()
        self._bar: Any = None
        self._closed = False
        if not enabled:
            return
        if (total is not None and _is_terminal(self.stream)) if bar is None else bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=name, unit=unit, file=self.stream, leave=False, dynamic_ncols=True)
        else:
            size = f" ({total} {unit})" if total is not None else ""
            self._write(f"{name}{size} ...")

    def _write(self, line: str) -> None:
        """One line on the stream, flushed (a closed or broken stream is ignored)."""
        try:
            print(line, file=self.stream, flush=True)
        except (OSError, ValueError):
            self.enabled = False

    @property
    def elapsed(self) -> float:
        """Seconds since the stage started."""
        return time.monotonic() - self.started

    def update(self, n: int = 1) -> None:
        """``n`` more items done; a plain progress line at most every ``every_s`` seconds."""
        self.count += n
        if not self.enabled or self._closed:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        rate = self.count / max(now - self.started, 1e-9)
        of = f"/{self.total}" if self.total is not None else ""
        left = ""
        if self.total is not None and rate > 0 and self.count < self.total:
            left = f", ~{_format_seconds((self.total - self.count) / rate)} left"
        self._write(f"{self.name}: {self.count}{of} {self.unit} ({rate:.2f} {self.unit}/s{left})")

    def close(self, failed: bool = False) -> float:
        """End the stage: close the bar and write ``done`` (or ``stopped``) with the elapsed seconds."""
        if self._closed:
            return self.elapsed
        self._closed = True
        elapsed = self.elapsed
        if self._bar is not None:
            self._bar.close()
        if self.enabled:
            self._write(f"{self.name}: {'stopped after' if failed else 'done in'} {_format_seconds(elapsed)}")
        return elapsed

    def __enter__(self) -> Stage:
        """The stage itself."""
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        """Close; an exception marks the stage as stopped."""
        self.close(failed=kind is not None)


def stage(name: str, total: int | None = None, **options: Any) -> Stage:
    """Report a stage of work on stderr: a bar on a terminal, rate-limited lines otherwise, then ``done in Xs``.

    Options: ``unit`` (``"ex"``), ``stream`` (stderr), ``enabled`` (False: silent, counts only),
    ``every_s`` (seconds between plain progress lines), ``bar`` (force a bar on or off).
    """
    return Stage(name, total, **options)
