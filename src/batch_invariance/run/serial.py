"""Sending a set of requests to one server serially: exactly one request in flight.

Faults (README, exit codes): a server that died is an infrastructure failure, so
:func:`run_serial` raises the handle's :class:`~batch_invariance.errors.InfraError` as soon as
its liveness check fails, and never goes on against a dead port. A transient failure of a live
server is retried once, with the same body (one request in flight either way, and a client that
gives up closes its connection, which cancels the request in llama-server). The concurrent pass
(:mod:`batch_invariance.run.dispatch`) never retries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import requests

from batch_invariance.core.workitem import WorkItem
from batch_invariance.errors import InfraError
from batch_invariance.run.response import RawResponse
from batch_invariance.run.transport import RequestTemplate, send

__all__ = ["TRANSIENT_MODES", "CheckAlive", "OnDone", "SerialRun", "run_serial"]

#: Called after each completed request with the response (from any thread).
OnDone = Callable[[RawResponse], None]

#: Failure modes of a live server worth one more try in a serial arm (``server_gone`` is
#: not: a dead server ends the run).
TRANSIENT_MODES: frozenset[str] = frozenset({"timeout", "connection_error", "http_error"})

#: Called with no arguments; raises :class:`InfraError` when the server died.
CheckAlive = Callable[[], None]


@dataclass(frozen=True)
class SerialRun:
    """What a serial arm got back: the answer to each id (the retry's, where one was sent),
    and the failed first attempt of every request that was retried."""

    responses: dict[str, RawResponse]
    first_attempts: dict[str, RawResponse]


def _raise_if_dead(resp: RawResponse, check_alive: CheckAlive | None) -> None:
    """Raise the handle's :class:`InfraError` when ``resp`` failed because the server died."""
    if resp.ok or check_alive is None:
        return
    check_alive()
    if resp.failure_mode == "server_gone":
        raise InfraError(f"the server stopped answering: {resp.transport_error}")


def run_serial(
    base_url: str,
    template: RequestTemplate,
    items: Sequence[WorkItem],
    check_alive: CheckAlive | None = None,
    on_done: OnDone | None = None,
) -> SerialRun:
    """Send ``items`` one at a time, in order, each transient failure retried once.

    Raises :class:`InfraError` when ``check_alive`` says the server died."""
    out: dict[str, RawResponse] = {}
    first_attempts: dict[str, RawResponse] = {}
    with requests.Session() as session:
        for item in items:
            resp = send(session, base_url, template, item, check_alive)
            _raise_if_dead(resp, check_alive)
            if resp.failure_mode in TRANSIENT_MODES:
                first_attempts[item.test_id] = resp
                resp = send(session, base_url, template, item, check_alive)
                _raise_if_dead(resp, check_alive)
            out[item.test_id] = resp
            if on_done is not None:
                on_done(resp)
    if check_alive is not None:
        check_alive()
    return SerialRun(out, first_attempts)
