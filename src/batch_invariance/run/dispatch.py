"""Sending a set of requests to one server: serially, or as a concurrent closed-loop pass.

:func:`run_serial` keeps exactly one request in flight. :func:`run_concurrent_pass` releases
N worker threads at once through a barrier; they drain a shared queue in a per-pass order
shuffled from the seed, while a sampler thread asks the server itself how many slots are busy
(``/slots``, and ``/metrics`` when enabled). Every thread is joined before either returns,
including when the caller is interrupted.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import requests

from batch_invariance.core.workitem import WorkItem
from batch_invariance.run.transport import (
    RawResponse,
    RequestTemplate,
    busy_from_metrics,
    busy_from_slots,
    get_json,
    get_text,
    send,
    tasks_from_slots,
)

#: Called after each completed request with the response (from any thread).
OnDone = Callable[[RawResponse], None]

#: The sampler polls at least this often (the spec asks for <= 50 ms; we use half).
SAMPLE_INTERVAL_S = 0.025


def pass_order(ids: Sequence[str], seed: int, pass_index: int) -> tuple[str, ...]:
    """The dispatch order of one concurrent pass: a shuffle seeded by (seed, pass index)."""
    order = list(ids)
    random.Random(f"batch-invariance:{seed}:{pass_index}").shuffle(order)
    return tuple(order)


def run_serial(
    base_url: str,
    template: RequestTemplate,
    items: Sequence[WorkItem],
    check_alive: Callable[[], None] | None = None,
    on_done: OnDone | None = None,
) -> dict[str, RawResponse]:
    """Send ``items`` one at a time, in order; return ``{test_id: RawResponse}``."""
    out: dict[str, RawResponse] = {}
    with requests.Session() as session:
        for item in items:
            resp = send(session, base_url, template, item, check_alive)
            out[item.test_id] = resp
            if on_done is not None:
                on_done(resp)
    return out


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


class _BusySampler(threading.Thread):
    """Polls ``/slots`` (and ``/metrics``) until stopped, tracking the most busy slots seen."""

    def __init__(self, base_url: str, metrics_enabled: bool, interval_s: float) -> None:
        super().__init__(name="bi-busy-sampler", daemon=True)
        self._base = base_url.rstrip("/")
        self._metrics = metrics_enabled
        self._interval = interval_s
        self.stop_event = threading.Event()
        self.slots_max: int | None = None
        self.metrics_max: int | None = None
        self.samples = 0
        self.tasks: set[int] = set()
        self._slots_ok = True

    def sample_once(self, session: requests.Session) -> None:
        if self._slots_ok:
            payload = get_json(session, self._base + "/slots", timeout_s=1.0)
            busy = busy_from_slots(payload)
            if busy is not None:
                self.slots_max = busy if self.slots_max is None else max(self.slots_max, busy)
                self.tasks.update(tasks_from_slots(payload))
        if self._metrics:
            text = get_text(session, self._base + "/metrics", timeout_s=1.0)
            busy = busy_from_metrics(text) if text is not None else None
            if busy is not None:
                self.metrics_max = busy if self.metrics_max is None else max(self.metrics_max, busy)
        self.samples += 1

    def run(self) -> None:
        with requests.Session() as session:
            while not self.stop_event.is_set():
                started = time.monotonic()
                self.sample_once(session)
                left = self._interval - (time.monotonic() - started)
                if left > 0:
                    self.stop_event.wait(left)
            # One last look, so a short pass still gets at least one sample after its start.
            if self.samples == 0:
                self.sample_once(session)

    def result(self) -> BusySample:
        candidates = [
            (v, s)
            for v, s in ((self.slots_max, "slots"), (self.metrics_max, "metrics"))
            if v is not None
        ]
        if candidates:
            best, source = max(candidates, key=lambda c: c[0])
        else:
            best, source = None, "none"
        return BusySample(
            busy_max=best,
            source=source,
            n_samples=self.samples,
            slots_busy_max=self.slots_max,
            metrics_busy_max=self.metrics_max,
            task_ids_seen=tuple(sorted(self.tasks)),
        )


def run_concurrent_pass(
    base_url: str,
    template: RequestTemplate,
    items: Sequence[WorkItem],
    workers: int,
    pass_index: int,
    seed: int,
    metrics_enabled: bool = False,
    check_alive: Callable[[], None] | None = None,
    on_done: OnDone | None = None,
    sample_interval_s: float = SAMPLE_INTERVAL_S,
) -> ConcurrentPass:
    """One C pass: ``workers`` closed-loop threads released together by a barrier.

    The queue holds the items in :func:`pass_order`; each worker has its own
    ``requests.Session`` and takes the next item as soon as its previous request completes.
    All threads (workers and sampler) are joined before this returns or re-raises.
    """
    if workers < 1:
        raise ValueError("workers must be >= 1")
    by_id = {item.test_id: item for item in items}
    order = pass_order([item.test_id for item in items], seed, pass_index)
    work: queue.Queue[WorkItem] = queue.Queue()
    for test_id in order:
        work.put(by_id[test_id])
    results: dict[str, RawResponse] = {}
    lock = threading.Lock()
    stop = threading.Event()
    barrier = threading.Barrier(workers + 1)
    sampler = _BusySampler(base_url, metrics_enabled, sample_interval_s)

    def worker() -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    item = work.get_nowait()
                except queue.Empty:
                    return
                resp = send(session, base_url, template, item, check_alive)
                with lock:
                    results[item.test_id] = resp
                if on_done is not None:
                    on_done(resp)

    threads = [
        threading.Thread(target=worker, name=f"bi-worker-{pass_index}-{k}", daemon=True)
        for k in range(workers)
    ]
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
    busy = sampler.result()
    return ConcurrentPass(
        index=pass_index,
        responses=dict(results),
        order=order,
        server_busy_max=busy.busy_max,
        busy_source=busy.source,
        busy=busy,
        wall_s=wall,
    )
