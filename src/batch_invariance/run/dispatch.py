"""Sending a set of requests to one server: serially, or as a concurrent closed-loop pass.

:func:`run_serial` keeps exactly one request in flight. :func:`run_concurrent_pass` releases
N worker threads at once through a barrier; they drain a shared queue in a per-pass order
shuffled from the seed, while a sampler thread asks the server itself how many slots are busy
(``/slots``, and ``/metrics`` when enabled). Every thread is joined before either returns,
including when the caller is interrupted.

Faults (README, exit codes): a server that died is an infrastructure failure, so both raise
the handle's :class:`~batch_invariance.errors.InfraError` as soon as its liveness check fails,
and never go on against a dead port. A transient failure of a live server is retried once in
a serial arm, with the same body (one request in flight either way, and a client that gives
up closes its connection, which cancels the request in llama-server); a concurrent pass is
never retried, because a request sent again would meet other co-batched neighbours.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests

from batch_invariance.core.workitem import WorkItem
from batch_invariance.engines.probes import BusyProbe, PassCounter, get_json, get_text
from batch_invariance.errors import InfraError
from batch_invariance.run.protocols import ServerHandle
from batch_invariance.run.response import RawResponse
from batch_invariance.run.transport import RequestTemplate, send

__all__ = [
    "SAMPLE_INTERVAL_S",
    "SETTLED_INTERVAL_S",
    "SETTLE_AFTER_S",
    "TRANSIENT_MODES",
    "BusySample",
    "CheckAlive",
    "ConcurrentPass",
    "OnDone",
    "SerialRun",
    "counter_deltas",
    "pass_order",
    "run_concurrent_pass",
    "run_serial",
]

#: Called after each completed request with the response (from any thread).
OnDone = Callable[[RawResponse], None]

#: The sampler polls this often during the first second of a pass (short passes need dense
#: samples to see their overlap) ...
SAMPLE_INTERVAL_S = 0.025
#: ... and at the spec's bound (<= 50 ms) after that: each poll wakes the server's HTTP thread,
#: which on a small CPU host stalls the decode threads. Measured on the embedded pair (one
#: --parallel 4 server, 16 prompts x 96 tokens, one pass each): 32.9 s with both witnesses
#: every 25 ms, 31.1 s every 50 ms, 28.9 s with no polling at all (within noise of one round).
SETTLED_INTERVAL_S = 0.05
SETTLE_AFTER_S = 1.0


def pass_order(ids: Sequence[str], seed: int, pass_index: int) -> tuple[str, ...]:
    """The dispatch order of one concurrent pass: a shuffle seeded by (seed, pass index)."""
    order = list(ids)
    random.Random(f"batch-invariance:{seed}:{pass_index}").shuffle(order)
    return tuple(order)


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


def _read_counters(
    session: requests.Session, counters: Sequence[PassCounter]
) -> dict[str, Mapping[str, float]]:
    out: dict[str, Mapping[str, float]] = {}
    for counter in counters:
        body = get_text(session, counter.url, timeout_s=1.0)
        totals = counter.read(body) if body is not None else None
        if totals is not None:
            out[counter.label] = totals
    return out


def counter_deltas(
    before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """Per counter, ``after - before`` of every total read both times (others are left out)."""
    return {
        label: {k: after[label][k] - v for k, v in totals.items() if k in after[label]}
        for label, totals in before.items()
        if label in after
    }


@dataclass(frozen=True)
class BusySample:
    """What the sampler saw on the server over one pass."""

    busy_max: int | None
    source: str
    n_samples: int
    slots_busy_max: int | None
    metrics_busy_max: int | None
    task_ids_seen: tuple[int, ...]


@dataclass(frozen=True)
class ConcurrentPass:
    """The outcome of one concurrent pass."""

    index: int
    responses: Mapping[str, RawResponse]
    order: tuple[str, ...]
    server_busy_max: int | None
    busy_source: str
    busy: BusySample
    wall_s: float
    #: Per :class:`PassCounter`, its totals' change over the pass (corroboration only).
    counter_deltas: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


class _BusySampler(threading.Thread):
    """Polls every :class:`BusyProbe` until stopped, tracking the most busy requests seen."""

    def __init__(self, probes: Sequence[BusyProbe], interval_s: float) -> None:
        super().__init__(name="bi-busy-sampler", daemon=True)
        self._probes = tuple(probes)
        self._interval = interval_s
        self.stop_event = threading.Event()
        self.maxima: dict[str, int] = {}
        self.samples = 0
        self.tasks: set[int] = set()

    def sample_once(self, session: requests.Session) -> None:
        for probe in self._probes:
            payload: Any
            if probe.kind == "json":
                payload = get_json(session, probe.url, timeout_s=1.0)
            else:
                payload = get_text(session, probe.url, timeout_s=1.0)
            busy = probe.read(payload) if payload is not None else None
            if busy is None:
                continue
            self.maxima[probe.label] = max(busy, self.maxima.get(probe.label, busy))
            if probe.tasks is not None:
                self.tasks.update(probe.tasks(payload))
        self.samples += 1

    def interval_at(self, elapsed_s: float) -> float:
        """The wait between two samples ``elapsed_s`` into the pass."""
        if elapsed_s < SETTLE_AFTER_S:
            return self._interval
        return max(self._interval, SETTLED_INTERVAL_S)

    def run(self) -> None:
        begun = time.monotonic()
        with requests.Session() as session:
            while not self.stop_event.is_set():
                started = time.monotonic()
                self.sample_once(session)
                left = self.interval_at(started - begun) - (time.monotonic() - started)
                if left > 0:
                    self.stop_event.wait(left)
            # One last look, so a short pass still gets at least one sample after its start.
            if self.samples == 0:
                self.sample_once(session)

    def result(self) -> BusySample:
        if self.maxima:
            source, best = max(self.maxima.items(), key=lambda c: c[1])
            best_or_none: int | None = best
        else:
            best_or_none, source = None, "none"
        return BusySample(
            busy_max=best_or_none,
            source=source,
            n_samples=self.samples,
            slots_busy_max=self.maxima.get("slots"),
            metrics_busy_max=self.maxima.get("metrics"),
            task_ids_seen=tuple(sorted(self.tasks)),
        )


def run_concurrent_pass(
    server: ServerHandle,
    template: RequestTemplate,
    items: Sequence[WorkItem],
    workers: int,
    pass_index: int,
    seed: int,
    on_done: OnDone | None = None,
    sample_interval_s: float = SAMPLE_INTERVAL_S,
    read_counters: bool = True,
    chains: Sequence[Sequence[str]] | None = None,
) -> ConcurrentPass:
    """One C pass: ``workers`` closed-loop threads released together by a barrier.

    The queue holds the items in :func:`pass_order`, each a chain of one; with ``chains`` (the
    prompt-cache arm's conversations) it holds those chains in their order instead, and a
    worker sends a chain's items one after another, so a later turn goes out only once its
    earlier turn was answered. Each worker has its own ``requests.Session`` and takes the
    next chain as soon as its previous request completes.
    All threads (workers and sampler) are joined before this returns or re-raises.
    The sampler reads the server's busy witnesses, as its engine names them (none: the pass
    then has no server-side overlap evidence, and F1 fails closed); its pass counters are
    read, where ``read_counters``, before the workers start and after they are joined. A
    request that finds the server gone stops every worker; once they are joined, the
    handle's ``check_alive`` raises :class:`InfraError` (nothing is retried).
    """
    base_url, check_alive = server.base_url, server.check_alive
    counters = server.pass_counters if read_counters else ()
    if workers < 1:
        raise ValueError("workers must be >= 1")
    by_id = {item.test_id: item for item in items}
    ids = [item.test_id for item in items]
    if chains is None:
        chains = [(test_id,) for test_id in pass_order(ids, seed, pass_index)]
    elif sorted(t for chain in chains for t in chain) != sorted(ids):
        raise ValueError("chains must hold every item's id exactly once")
    order = tuple(t for chain in chains for t in chain)
    work: queue.Queue[tuple[WorkItem, ...]] = queue.Queue()
    for chain in chains:
        work.put(tuple(by_id[test_id] for test_id in chain))
    results: dict[str, RawResponse] = {}
    lock = threading.Lock()
    stop = threading.Event()
    barrier = threading.Barrier(workers + 1)
    sampler = _BusySampler(server.busy_probes, sample_interval_s)

    def worker() -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    chain = work.get_nowait()
                except queue.Empty:
                    return
                for item in chain:
                    if stop.is_set():
                        return
                    resp = send(session, base_url, template, item, check_alive)
                    with lock:
                        results[item.test_id] = resp
                    if resp.failure_mode == "server_gone":
                        stop.set()  # the pass cannot finish: send nothing more to a dead port
                        return
                    if on_done is not None:
                        on_done(resp)

    threads = [
        threading.Thread(target=worker, name=f"bi-worker-{pass_index}-{k}", daemon=True)
        for k in range(workers)
    ]
    with requests.Session() as session:
        before = _read_counters(session, counters)
    started = time.monotonic()
    try:
        sampler.start()
        for thread in threads:
            thread.start()
        barrier.wait()
        for thread in threads:
            thread.join()
    finally:
        # Reached normally, or on KeyboardInterrupt / Interrupted: stop handing out work,
        # release anyone still at the barrier, and join everything we started.
        stop.set()
        barrier.abort()
        sampler.stop_event.set()
        # A worker blocked in a request returns within the request timeout; one deadline for
        # all of them, so N stuck workers never cost N timeouts.
        deadline = time.monotonic() + template.timeout_s + 5.0
        for thread in threads:
            if thread.ident is not None:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if sampler.ident is not None:
            sampler.join(timeout=5.0)
    wall = time.monotonic() - started
    check_alive()
    gone = [r for r in results.values() if r.failure_mode == "server_gone"]
    if gone:
        raise InfraError(f"the server stopped answering: {gone[0].transport_error}")
    with requests.Session() as session:
        after = _read_counters(session, counters)
    busy = sampler.result()
    return ConcurrentPass(
        index=pass_index,
        responses=dict(results),
        order=order,
        server_busy_max=busy.busy_max,
        busy_source=busy.source,
        busy=busy,
        wall_s=wall,
        counter_deltas=counter_deltas(before, after),
    )
