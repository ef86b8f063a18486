"""Feedback on long work: one stage reporter for every step that takes more than a second.

``with stage("capturing base", total=24) as s: ... s.update(8)`` shows a tqdm bar when stderr is a
terminal and the total is known; otherwise it writes plain lines, rate-limited (a start line, at
most one progress line every ``every_s`` seconds, and a ``done`` line with the elapsed seconds), so
logs of batch jobs and CI show where the time goes without one line per batch. A stage that ends
within ``delay_s`` (1 s) prints nothing, and one stopped by a usage error prints no ``stopped`` line
(the error line says why), so quick work and refusals stay one line. Layer 0: imports only errors.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import IO, Any

from anchorlens.errors import AnchorlensError

DEFAULT_EVERY_S = 10.0
DEFAULT_DELAY_S = 1.0


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

    def __init__(
        self,
        name: str,
        total: int | None = None,
        *,
        unit: str = "ex",
        stream: IO[str] | None = None,
        enabled: bool = True,
        every_s: float = DEFAULT_EVERY_S,
        delay_s: float = DEFAULT_DELAY_S,
        bar: bool | None = None,
    ) -> None:
        """Start the stage now: the bar or the start line appears after ``delay_s`` if still running."""
        self.name, self.total, self.unit = name, total, unit
        self.stream = sys.stderr if stream is None else stream
        self.enabled, self.every_s = enabled, every_s
        self.count = 0
        self.started = self._last = time.monotonic()
        self._bar: Any = None
        self._closed = False
        self._shown = False
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        if not enabled:
            return
        if (total is not None and _is_terminal(self.stream)) if bar is None else bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total, desc=name, unit=unit, file=self.stream, leave=False, dynamic_ncols=True, delay=delay_s
            )
        elif delay_s <= 0:
            self._announce()
        else:
            self._timer = threading.Timer(delay_s, self._announce)
            self._timer.daemon = True
            self._timer.start()

    def _announce(self) -> None:
        """The start line (once, unless the stage already ended)."""
        with self._lock:
            if self._shown or self._closed:
                return
            self._shown = True
        size = f" ({self.total} {self.unit})" if self.total is not None else ""
        self._write(f"{self.name}{size} ...")

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
        if not self._shown or now - self._last < self.every_s:
            return
        self._last = now
        rate = self.count / max(now - self.started, 1e-9)
        of = f"/{self.total}" if self.total is not None else ""
        left = ""
        if self.total is not None and rate > 0 and self.count < self.total:
            left = f", ~{_format_seconds((self.total - self.count) / rate)} left"
        self._write(f"{self.name}: {self.count}{of} {self.unit} ({rate:.2f} {self.unit}/s{left})")

    def close(self, failed: bool = False, quiet: bool = False) -> float:
        """End the stage: close the bar; if the start was shown, write ``done`` (or ``stopped``) with the seconds.

        ``quiet``: no end line (a usage error ended the stage; its own line says why).
        """
        with self._lock:
            if self._closed:
                return self.elapsed
            self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        elapsed = self.elapsed
        if self._bar is not None:
            self._bar.close()
            self._shown = self.enabled and elapsed >= self._bar.delay
        if self.enabled and self._shown and not quiet:
            self._write(f"{self.name}: {'stopped after' if failed else 'done in'} {_format_seconds(elapsed)}")
        return elapsed

    def __enter__(self) -> Stage:
        """The stage itself."""
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        """Close; an exception marks the stage as stopped (silently for a usage error)."""
        self.close(failed=kind is not None, quiet=isinstance(err, AnchorlensError))


def stage(name: str, total: int | None = None, **options: Any) -> Stage:
    """Report a stage of work on stderr: a bar on a terminal, rate-limited lines otherwise, then ``done in Xs``.

    Options: ``unit`` (``"ex"``), ``stream`` (stderr), ``enabled`` (False: silent, counts only),
    ``every_s`` (seconds between plain progress lines), ``delay_s`` (quiet for stages shorter than
    this), ``bar`` (force a bar on or off).
    """
    return Stage(name, total, **options)
