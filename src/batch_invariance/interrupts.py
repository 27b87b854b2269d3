"""The one SIGTERM policy: a SIGTERM unwinds as :class:`~batch_invariance.errors.Interrupted`,
so every ``with`` block (servers, temp files) tears down and no partial cert is written.

``cli.main`` and the Action install it for the whole run; a
:class:`~batch_invariance.servers.process.ServerProcess` used outside them installs it only
while nobody else handles SIGTERM.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, NoReturn

from batch_invariance.errors import Interrupted

__all__ = ["install_sigterm", "raise_interrupted", "restore_sigterm", "sigterm_raises"]


def raise_interrupted(signum: int, frame: FrameType | None) -> NoReturn:
    raise Interrupted(signum)


def install_sigterm(only_if_default: bool = False) -> Any:
    """Make SIGTERM raise :class:`Interrupted`; return the handler to restore, or ``None``
    when nothing was installed (not the main thread, or someone else handles SIGTERM)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    current = signal.getsignal(signal.SIGTERM)
    if only_if_default and current not in (signal.SIG_DFL, None):
        return None
    signal.signal(signal.SIGTERM, raise_interrupted)
    return signal.SIG_DFL if current is None else current


def restore_sigterm(previous: Any) -> None:
    """Put back what :func:`install_sigterm` returned (``None``: nothing to undo)."""
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Interrupted` inside the block."""
    previous = install_sigterm()
    try:
        yield
    finally:
        restore_sigterm(previous)
