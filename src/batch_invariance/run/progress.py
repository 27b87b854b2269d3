"""Progress of a cell on stderr.

The driver reports through the :class:`ProgressSink` protocol. On a terminal,
:class:`Progress` draws one self-overwriting line (arm, pass, done/total, ETA). Anywhere else
(a CI log, a pipe) it writes one line per arm and per C pass once it has run: what ran, how
long it took, and what it found so far, so a long cell never looks hung in a log. Inside
GitHub Actions (``GITHUB_ACTIONS=true``) each arm's lines sit in a ``::group::``. Stdout,
which machine readers parse, never gets progress.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TextIO

__all__ = ["ArmReport", "NullProgress", "Progress", "ProgressSink", "format_eta", "report_line"]


@dataclass(frozen=True)
class ArmReport:
    """What one arm (or one C pass) did, as the driver tells the sink when it has run."""

    n_requests: int
    #: Requests that ended in a transport failure (after a serial arm's one retry).
    n_failed: int = 0
    #: Serial requests sent a second time after a transient failure.
    n_retried: int = 0
    #: Ids whose answer differs from arm A's (for C: on any pass so far), out of ``compared``;
    #: ``None`` for arm A itself.
    differ: int | None = None
    compared: int | None = None
    #: Whether ``differ`` accumulates over the passes run so far (C) or is this arm's own.
    so_far: bool = False
    #: C: ids whose logprobs differ from A's bitwise on any pass so far, the early detector
    #: (docs/power.md); ``None`` where not counted.
    drift: int | None = None


class ProgressSink(Protocol):
    """What the driver calls while a cell runs. Methods may be called from worker threads."""

    def begin(self, total: int) -> None: ...

    def arm(
        self, name: str, pass_index: int | None = None, n_passes: int | None = None
    ) -> None: ...

    def done(self, report: ArmReport) -> None:
        """The arm (or pass) last named by :meth:`arm` has run."""

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


def report_line(label: str, wall_s: float, report: ArmReport) -> str:
    """``C pass 2/4: 16 requests in 21.3 s, 6 of 16 differ from A so far``."""
    plural = "" if report.n_requests == 1 else "s"
    parts = [f"{label}: {report.n_requests} request{plural} in {wall_s:.1f} s"]
    if report.n_failed:
        parts.append(f"{report.n_failed} failed")
    if report.n_retried:
        parts.append(f"{report.n_retried} retried once")
    if report.differ is not None and report.compared is not None:
        tail = " so far" if report.so_far else ""
        parts.append(f"{report.differ} of {report.compared} differ from A{tail}")
        if report.drift:  # drifting rows: no GREEN at exact equality, whatever follows
            parts.append(f"{report.drift} of {report.compared} drift from A bitwise{tail}")
    return ", ".join(parts)


class Progress:
    """Progress on ``stream``: a self-overwriting line on a TTY (or with ``enabled=True``),
    else one line per arm and C pass (``::group::`` per arm when ``env`` says GitHub
    Actions). ``clock`` times the arms and the ETA."""

    def __init__(
        self,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_interval_s: float = 0.1,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        if enabled is None:
            try:
                enabled = bool(self._stream.isatty())
            except (AttributeError, ValueError):
                enabled = False
        self.enabled = enabled
        self._groups = (os.environ if env is None else env).get("GITHUB_ACTIONS") == "true"
        self._clock = clock
        self._min_interval = min_interval_s
        self._lock = threading.Lock()
        self._total = 0
        self._done = 0
        self._label = ""
        self._scope = ""
        self._started = clock()
        self._arm_started = self._started
        self._group: str | None = None
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
            self._arm_started = self._clock()
            if self.enabled:
                self._draw(force=True)
            elif self._groups:
                self._open_group(f"{self._scope}arm {name}")

    def done(self, report: ArmReport) -> None:
        with self._lock:
            if self.enabled:
                return
            line = report_line(self._label, self._clock() - self._arm_started, report)
            self._write(f"batch-invariance: {self._scope}{line}")

    def _open_group(self, title: str) -> None:
        if title == self._group:
            return
        self._close_group()
        self._write(f"::group::{title}")
        self._group = title

    def _close_group(self) -> None:
        if self._group is not None:
            self._write("::endgroup::")
            self._group = None

    def _write(self, line: str) -> None:
        self._stream.write(line + "\n")
        self._stream.flush()

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
            self._close_group()


class NullProgress:
    """A sink that does nothing."""

    def begin(self, total: int) -> None:
        return

    def arm(self, name: str, pass_index: int | None = None, n_passes: int | None = None) -> None:
        return

    def done(self, report: ArmReport) -> None:
        return

    def extend(self, n: int) -> None:
        return

    def scope(self, text: str) -> None:
        return

    def advance(self, n: int = 1) -> None:
        return

    def end(self) -> None:
        return
