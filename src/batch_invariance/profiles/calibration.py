"""Calibrate a profile's work-set on the A server, then hand that same server to the driver.

The profile's prompts are fitted with the real tokenizer of the server under test, once, on
the A server (``--parallel 1 -c C``), before any request is measured; the frozen work-set is
then sent to every arm. :class:`PrelaunchedLauncher` wraps any ``ServerLauncher`` so that the
server started for calibration *is* the driver's A server: it is launched once, not twice.

Typical use (``run-live --profile``)::

    with PrelaunchedLauncher(launcher, ctx=ctx) as pre:
        workset = profile_run.build_workset(ctx, server_token_counter(pre.handle.base_url))
        cell = run_cell(plan_for(workset), pre, profile_run.scorer)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Literal

from batch_invariance.core.roles import ServerRole
from batch_invariance.run.records import ServerHandle, ServerLauncher

__all__ = ["PrelaunchedLauncher"]


class PrelaunchedLauncher:
    """A ``ServerLauncher`` whose first ``launch(role, parallel, ctx)`` matching the held server
    yields the already running one (and tears it down when the driver is done with it).

    Every other launch goes to the wrapped launcher. Leaving the ``with`` block tears the held
    server down if the driver never took it (e.g. calibration failed). Read launch records
    and aborts from the wrapped launcher itself.
    """

    def __init__(
        self,
        inner: ServerLauncher,
        *,
        ctx: int,
        role: ServerRole = ServerRole.A,
        parallel: int = 1,
    ) -> None:
        self._inner = inner
        self._key = (role, parallel, ctx)
        self._cm: AbstractContextManager[ServerHandle] | None = None
        self._handle: ServerHandle | None = None
        self._handed = False

    @property
    def source(self) -> Literal["live", "mock", "attached"]:
        return self._inner.source

    @property
    def handle(self) -> ServerHandle:
        """The held server (only inside the ``with`` block)."""
        if self._handle is None:
            raise RuntimeError("PrelaunchedLauncher: no server is held (use it in a with block)")
        return self._handle

    def __enter__(self) -> PrelaunchedLauncher:
        role, parallel, ctx = self._key
        cm = self._inner.launch(role, parallel, ctx)
        self._handle = cm.__enter__()
        self._cm = cm
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release(exc_type, exc, tb)

    def _release(
        self,
        exc_type: type[BaseException] | None = None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
    ) -> None:
        cm, self._cm, self._handle = self._cm, None, None
        if cm is not None:
            cm.__exit__(exc_type, exc, tb)

    @contextlib.contextmanager
    def _yield_held(self) -> Iterator[ServerHandle]:
        handle = self.handle
        try:
            yield handle
        except BaseException as exc:
            self._release(type(exc), exc, exc.__traceback__)
            raise
        self._release()

    def launch(
        self, role: ServerRole, parallel: int, ctx: int
    ) -> AbstractContextManager[ServerHandle]:
        if not self._handed and self._cm is not None and (role, parallel, ctx) == self._key:
            self._handed = True
            return self._yield_held()
        return self._inner.launch(role, parallel, ctx)
