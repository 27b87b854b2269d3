"""Sending a set of requests to one server: serially, or as a concurrent closed-loop pass.

:func:`run_serial` (:mod:`batch_invariance.run.transport`, re-exported here) keeps exactly one
request in flight. :func:`run_concurrent_pass` releases N worker threads at once through a
barrier; they drain a shared queue in a per-pass order shuffled from the seed, while a sampler
thread asks the server itself how many slots are busy (``/slots``, and ``/metrics`` when
enabled). Every thread is joined before either returns, including when the caller is
interrupted.

Faults (README, exit codes): a server that died is an infrastructure failure, so both raise
the handle's :class:`~batch_invariance.errors.InfraError` as soon as its liveness check fails,
and never go on against a dead port. A transient failure of a live server is retried once in
a serial arm, with the same body (one request in flight either way, and a client that gives
up closes its connection, which cancels the request in llama-server); a concurrent pass is
never retried, because a request sent again would meet other co-batched neighbours.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests

from batch_invariance.core.kv_budget import pool_order
from batch_invariance.core.plan import WorkItem
from batch_invariance.engines.probes import BusyProbe, PassCounter, get_json, get_text
from batch_invariance.errors import InfraError
from batch_invariance.run.kv_gate import KvGate, KvPool, pass_gate
from batch_invariance.run.records import ServerHandle
from batch_invariance.run.transport import (
    TRANSIENT_MODES,
    CheckAlive,
    OnDone,
    RequestTemplate,
    SerialRun,
    run_serial,
    send,
)
from batch_invariance.run.trials import RawResponse

__all__ = [
    "BUSY_READ_TIMEOUT_S",
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

#: The sampler polls this often during the first second of a pass (short passes need dense
#: samples to see their overlap) ...
SAMPLE_INTERVAL_S = 0.025
#: ... and at the spec's bound (<= 50 ms) after that: each poll wakes the server's HTTP thread,
#: which on a small CPU host stalls the decode threads. Measured on the embedded pair (one
#: --parallel 4 server, 16 prompts x 96 tokens, one pass each): 32.9 s with both witnesses
#: every 25 ms, 31.1 s every 50 ms, 28.9 s with no polling at all (within noise of one round).
SETTLED_INTERVAL_S = 0.05
SETTLE_AFTER_S = 1.0
#: How long one witness read may take. A server answers ``/metrics`` or ``/slots`` late when
#: its decode has the cores: vLLM's CPU build on 2 cores, its API process competing with the
#: engine's OpenMP threads, answered ``/metrics`` in 7-25 ms at the median but up to 4.5 s with
#: three busy loops beside it (measured on the embedded Gemma, 16 chat requests, N 4). A late
#: answer is still evidence: it tells the state when the server rendered it, inside the pass
#: or after it (never more than ran). With a 1 s timeout a CI run lost every read taken while
#: requests ran, and F1 saw only idle reads (server busy 0, the cell UNVERIFIED).
BUSY_READ_TIMEOUT_S = 10.0


def pass_order(ids: Sequence[str], seed: int, pass_index: int) -> tuple[str, ...]:
    """The dispatch order of one concurrent pass: a shuffle seeded by (seed, pass index)."""
    order = list(ids)
    random.Random(f"batch-invariance:{seed}:{pass_index}").shuffle(order)
    return tuple(order)


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
    #: Of ``n_samples`` rounds, how many got a count from at least one witness.
    n_answered: int
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
        self.probes = tuple(probes)
        self._interval = interval_s
        self.stop_event = threading.Event()
        self.maxima: dict[str, int] = {}
        self.samples = 0
        self.answered = 0
        self.tasks: set[int] = set()

    def sample_once(self, session: requests.Session) -> None:
        answered = False
        for probe in self.probes:
            payload: Any
            if probe.kind == "json":
                payload = get_json(session, probe.url, timeout_s=BUSY_READ_TIMEOUT_S)
            else:
                payload = get_text(session, probe.url, timeout_s=BUSY_READ_TIMEOUT_S)
            busy = probe.read(payload) if payload is not None else None
            if busy is None:
                continue
            answered = True
            self.maxima[probe.label] = max(busy, self.maxima.get(probe.label, busy))
            if probe.tasks is not None:
                self.tasks.update(probe.tasks(payload))
        self.samples += 1
        self.answered += answered

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
            n_answered=self.answered,
            slots_busy_max=self.maxima.get("slots"),
            metrics_busy_max=self.maxima.get("metrics"),
            task_ids_seen=tuple(sorted(self.tasks)),
        )


@dataclass(frozen=True)
class _PassWork:
    """What one pass hands out: its chains of items, in queue order, and their ids in order."""

    chains: tuple[tuple[WorkItem, ...], ...]
    order: tuple[str, ...]


def _pass_work(
    items: Sequence[WorkItem],
    seed: int,
    pass_index: int,
    chains: Sequence[Sequence[str]] | None,
    pool: KvPool | None = None,
) -> _PassWork:
    """The chains of one pass: each item a chain of one in :func:`pass_order` (on a unified
    ``pool``, as :func:`~batch_invariance.core.kv_budget.pool_order` moves it), or ``chains``
    (which must hold every item's id exactly once) in their order."""
    by_id = {item.test_id: item for item in items}
    ids = [item.test_id for item in items]
    if chains is None:
        order = pass_order(ids, seed, pass_index)
        if pool is not None:
            order = pool_order(order, pool.costs, pool.tokens, pool.parallel)
        chains = [(test_id,) for test_id in order]
    elif sorted(t for chain in chains for t in chain) != sorted(ids):
        raise ValueError("chains must hold every item's id exactly once")
    return _PassWork(
        chains=tuple(tuple(by_id[test_id] for test_id in chain) for chain in chains),
        order=tuple(t for chain in chains for t in chain),
    )


class _ClosedLoop:
    """The workers of one pass: released together by a barrier, each drains the shared queue
    of chains on its own session, and the first request that finds the server gone stops
    them all."""

    def __init__(
        self,
        server: ServerHandle,
        template: RequestTemplate,
        gate: KvGate,
        workers: int,
        on_done: OnDone | None,
    ) -> None:
        self._base_url, self._check_alive = server.base_url, server.check_alive
        self._template = template
        self._on_done = on_done
        self.gate = gate
        self._lock = threading.Lock()
        self.results: dict[str, RawResponse] = {}
        self.stop = threading.Event()
        self.barrier = threading.Barrier(workers + 1)

    def worker(self) -> None:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            return
        with requests.Session() as session:
            while not self.stop.is_set():
                taken = self.gate.take()
                if taken is None:
                    return
                try:
                    if not self._send_chain(session, taken[1]):
                        return
                finally:
                    self.gate.done(taken[0])

    def _send_chain(self, session: requests.Session, chain: tuple[WorkItem, ...]) -> bool:
        """Send a chain's items one after another; False once the pass must stop."""
        for item in chain:
            if self.stop.is_set():
                return False
            resp = send(session, self._base_url, self._template, item, self._check_alive)
            with self._lock:
                self.results[item.test_id] = resp
            if resp.failure_mode == "server_gone":
                self.stop.set()  # the pass cannot finish: send nothing more to a dead port
                self.gate.close()
                return False
            if self._on_done is not None:
                self._on_done(resp)
        return True

    def raise_if_gone(self) -> None:
        """Raise :class:`InfraError` when a request of the pass found the server gone."""
        gone = [r for r in self.results.values() if r.failure_mode == "server_gone"]
        if gone:
            raise InfraError(f"the server stopped answering: {gone[0].transport_error}")


def _run_and_join(
    loop: _ClosedLoop,
    threads: Sequence[threading.Thread],
    sampler: _BusySampler,
    request_timeout_s: float,
) -> float:
    """Start the sampler and the workers, release the workers together, and join every
    thread, also when the caller is interrupted. Returns when (``time.monotonic``) the last
    worker was done: the pass's end, whatever the sampler's last read still took."""
    try:
        sampler.start()
        for thread in threads:
            thread.start()
        loop.barrier.wait()
        for thread in threads:
            thread.join()
    finally:
        # Reached normally, or on KeyboardInterrupt / Interrupted: stop handing out work,
        # release anyone still at the barrier, and join everything we started.
        loop.stop.set()
        loop.gate.close()  # workers waiting for room in the pool return
        loop.barrier.abort()
        sampler.stop_event.set()
        # A worker blocked in a request returns within the request timeout; one deadline for
        # all of them, so N stuck workers never cost N timeouts.
        deadline = time.monotonic() + request_timeout_s + 5.0
        for thread in threads:
            if thread.ident is not None:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        workers_done = time.monotonic()
        if sampler.ident is not None:
            # A read in flight ends within its own timeout.
            sampler.join(timeout=BUSY_READ_TIMEOUT_S * len(sampler.probes) + 1.0)
    return workers_done


def _read_counters_now(counters: Sequence[PassCounter]) -> dict[str, Mapping[str, float]]:
    with requests.Session() as session:
        return _read_counters(session, counters)


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
    pool: KvPool | None = None,
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
    handle's ``check_alive`` raises :class:`InfraError` (nothing is retried). With a unified
    ``pool``, a chain goes out only when the cells in flight leave room for it
    (:class:`~batch_invariance.run.kv_gate.KvGate`).
    """
    counters = server.pass_counters if read_counters else ()
    if workers < 1:
        raise ValueError("workers must be >= 1")
    work = _pass_work(items, seed, pass_index, chains, pool)
    loop = _ClosedLoop(server, template, pass_gate(work.chains, pool), workers, on_done)
    sampler = _BusySampler(server.busy_probes, sample_interval_s)
    threads = [
        threading.Thread(target=loop.worker, name=f"bi-worker-{pass_index}-{k}", daemon=True)
        for k in range(workers)
    ]
    before = _read_counters_now(counters)
    started = time.monotonic()
    wall = _run_and_join(loop, threads, sampler, template.timeout_s) - started
    server.check_alive()
    loop.raise_if_gone()
    after = _read_counters_now(counters)
    busy = sampler.result()
    return ConcurrentPass(
        index=pass_index,
        responses=dict(loop.results),
        order=work.order,
        server_busy_max=busy.busy_max,
        busy_source=busy.source,
        busy=busy,
        wall_s=wall,
        counter_deltas=counter_deltas(before, after),
    )
