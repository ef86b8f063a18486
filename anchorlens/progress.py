"""Feedback on long work: one stage reporter for every step that takes more than a second.

``with stage("capturing base", total=24) as s: ... s.update(8)`` shows a tqdm bar when stderr is a
terminal and the total is known; otherwise it writes plain lines, rate-limited (a start line, at
most one progress line every ``every_s`` seconds, and a ``done`` line with the elapsed seconds), so
logs of batch jobs and CI show where the time goes without one line per batch. A progress line
(:func:`progress_line`) gives the items done, the rate, an ETA and the rows written so far
(``s.update(n, rows=k)``); items resumed from disk (``s.update(n, resumed=True)``) count as done but not
in the rate, so a resumed run's ETA is not flattered by work it did not do. A stage that ends
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


def progress_line(
    name: str,
    count: int,
    total: int | None,
    elapsed: float,
    *,
    unit: str = "ex",
    resumed: int = 0,
    rows: int | None = None,
) -> str:
    """``capture: 64/2490 ex (3.20 ex/s, ~12m38s left, 1,201,920 rows written)``: ``count`` items done of ``total``
    in ``elapsed`` seconds, ``resumed`` of them read back from disk (left out of the rate and the ETA)."""
    worked = count - resumed
    rate = worked / elapsed if elapsed > 0 else 0.0
    of = f"/{total}" if total is not None else ""
    parts = [f"{rate:.2f} {unit}/s"]
    if total is not None and count < total:
        parts.append(f"~{_format_seconds((total - count) / rate)} left" if rate > 0 else "time left unknown")
    if resumed:
        parts.append(f"{resumed} resumed")
    if rows is not None:
        parts.append(f"{rows:,} rows written")
    return f"{name}: {count}{of} {unit} ({', '.join(parts)})"


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
        self.resumed = 0
        self.rows: int | None = None
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

    def update(self, n: int = 1, *, rows: int | None = None, resumed: bool = False) -> None:
        """``n`` more items done (``resumed``: read back from disk, not computed), ``rows`` the rows written so far;
        a plain progress line at most every ``every_s`` seconds."""
        self.count += n
        self.resumed += n if resumed else 0
        self.rows = self.rows if rows is None else rows
        if not self.enabled or self._closed:
            return
        if self._bar is not None:
            if self.rows is not None:
                self._bar.set_postfix_str(f"{self.rows:,} rows", refresh=False)
            self._bar.update(n)
            return
        now = time.monotonic()
        if not self._shown or now - self._last < self.every_s:
            return
        self._last = now
        self._write(self.line(now - self.started))

    def line(self, elapsed: float | None = None) -> str:
        """The progress line now (or after ``elapsed`` seconds): see :func:`progress_line`."""
        return progress_line(
            self.name,
            self.count,
            self.total,
            self.elapsed if elapsed is None else elapsed,
            unit=self.unit,
            resumed=self.resumed,
            rows=self.rows,
        )

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
