"""Progress of a cell on stderr: arm, pass, done/total and an ETA, only while stderr is a TTY.

The driver reports through the :class:`ProgressSink` protocol; :class:`Progress` draws one
self-overwriting line and is silent when its stream is not a terminal (CI logs, pipes), so
machine-read output never gets progress noise mixed in.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol, TextIO


class ProgressSink(Protocol):
    """What the driver calls while a cell runs. Methods may be called from worker threads."""

    def begin(self, total: int) -> None: ...

    def arm(
        self, name: str, pass_index: int | None = None, n_passes: int | None = None
    ) -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def extend(self, n: int) -> None:
        """Change the total by ``n`` (A' decided on, passes cut short by an early stop)."""

    def scope(self, text: str) -> None:
        """Name what the next arms belong to (a sweep's ``cell k/K N=n``)."""

    def end(self) -> None: ...


def format_eta(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``42s`` or ``--`` when unknown."""
    if seconds is None or seconds < 0 or seconds != seconds:
        return "--"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    """A one-line progress display; a no-op unless ``stream`` is a TTY (or ``enabled=True``)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_interval_s: float = 0.1,
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        if enabled is None:
            try:
                enabled = bool(self._stream.isatty())
            except (AttributeError, ValueError):
                enabled = False
        self.enabled = enabled
        self._clock = clock
        self._min_interval = min_interval_s
        self._lock = threading.Lock()
        self._total = 0
        self._done = 0
        self._label = ""
        self._scope = ""
        self._started = clock()
        self._last_draw = float("-inf")
        self._drawn = False

    def begin(self, total: int) -> None:
        with self._lock:
            self._total = total
            self._done = 0
            self._started = self._clock()

    def arm(self, name: str, pass_index: int | None = None, n_passes: int | None = None) -> None:
        with self._lock:
            if pass_index is not None and n_passes is not None:
                self._label = f"arm {name} pass {pass_index + 1}/{n_passes}"
            else:
                self._label = f"arm {name}"
            self._draw(force=True)

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self._done += n
            self._draw(force=self._done >= self._total)

    def scope(self, text: str) -> None:
        with self._lock:
            self._scope = f"{text}: " if text else ""

    def extend(self, n: int) -> None:
        with self._lock:
            self._total = max(self._done, self._total + n)

    def line(self) -> str:
        """The current progress line (without the carriage return)."""
        elapsed = self._clock() - self._started
        eta: float | None = None
        if self._done > 0 and self._total >= self._done:
            eta = elapsed / self._done * (self._total - self._done)
        pct = 100.0 * self._done / self._total if self._total else 0.0
        return (
            f"batch-invariance: {self._scope}{self._label:<18} {self._done}/{self._total} "
            f"({pct:3.0f}%) ETA {format_eta(eta)}"
        )

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = self._clock()
        if not force and now - self._last_draw < self._min_interval:
            return
        self._last_draw = now
        self._stream.write("\r" + self.line() + "\x1b[K")
        self._stream.flush()
        self._drawn = True

    def end(self) -> None:
        with self._lock:
            if self.enabled and self._drawn:
                self._stream.write("\n")
                self._stream.flush()
            self._drawn = False


class NullProgress:
    """A sink that does nothing."""

    def begin(self, total: int) -> None:
        return

    def arm(self, name: str, pass_index: int | None = None, n_passes: int | None = None) -> None:
        return

    def extend(self, n: int) -> None:
        return

    def scope(self, text: str) -> None:
        return

    def advance(self, n: int = 1) -> None:
        return

    def end(self) -> None:
        return
