"""Serial and concurrent dispatch against the loopback mock: real overlap, real sampling."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

import pytest
import requests

from batch_invariance.core.plan import WorkItem
from batch_invariance.engines.llama_server.probes import llama_server_probes
from batch_invariance.engines.probes import BusyProbe, PassCounter
from batch_invariance.engines.witness import gauge_probe
from batch_invariance.mock import MockKnobs, MockServer
from batch_invariance.run.dispatch import (
    SAMPLE_INTERVAL_S,
    SETTLED_INTERVAL_S,
    _BusySampler,
    pass_order,
    run_concurrent_pass,
    run_serial,
)
from batch_invariance.run.transport import RequestTemplate
from batch_invariance.run.trials import RawResponse
from tests.support.held import peak_held
from tests.support.loopback import serving

ITEMS = tuple(WorkItem(f"q{i:02d}", f"What is {i} + {i}?", None, str(2 * i)) for i in range(12))
TEMPLATE = RequestTemplate("chat", n_predict=16, seed=0, timeout_s=10)
SLOW = MockKnobs(token_delay_s=0.02, prompt_token_delay_s=0.001)


@dataclass(frozen=True)
class _Handle:
    """The look-alike as a pass reads its handle: llama-server's busy witnesses (``/slots``,
    and ``/metrics`` when the server was started with it), no pass counters."""

    server: MockServer
    metrics: bool = False

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def busy_probes(self) -> tuple[BusyProbe, ...]:
        return tuple(llama_server_probes(self.server.base_url, self.metrics))

    @property
    def pass_counters(self) -> tuple[PassCounter, ...]:
        return ()

    def check_alive(self) -> None:
        self.server.check_alive()


def _max_depth(responses: dict[str, RawResponse]) -> int:
    return peak_held((r.dispatch_ts, r.complete_ts, 1) for r in responses.values())


def test_pass_order_is_a_seeded_permutation_per_pass() -> None:
    ids = [i.test_id for i in ITEMS]
    first = pass_order(ids, seed=3, pass_index=0)
    assert sorted(first) == sorted(ids)
    assert first == pass_order(ids, seed=3, pass_index=0)
    assert first != pass_order(ids, seed=3, pass_index=1)
    assert first != pass_order(ids, seed=4, pass_index=0)


def test_serial_never_overlaps_even_on_a_parallel_server() -> None:
    with MockServer(parallel=4, knobs=SLOW) as server:
        done: list[str] = []
        out = run_serial(
            server.base_url,
            TEMPLATE,
            ITEMS[:6],
            server.check_alive,
            lambda r: done.append(r.test_id),
        ).responses
        assert server.stats.max_busy == 1
    assert list(out) == [i.test_id for i in ITEMS[:6]] == done
    assert _max_depth(out) == 1
    assert all(
        r.ok and r.text == i.expected_answer for r, i in zip(out.values(), ITEMS, strict=False)
    )


def test_concurrent_pass_really_overlaps_and_the_server_says_so() -> None:
    with MockServer(parallel=4, knobs=SLOW) as server:
        result = run_concurrent_pass(
            _Handle(server, metrics=True), TEMPLATE, ITEMS, workers=4, pass_index=2, seed=9,
        )  # fmt: skip
        assert server.stats.max_busy >= 2
    assert set(result.responses) == {i.test_id for i in ITEMS}
    assert all(r.ok for r in result.responses.values())
    assert _max_depth(dict(result.responses)) >= 2
    assert result.server_busy_max is not None and result.server_busy_max >= 2
    assert result.busy_source == "slots"
    assert result.busy.n_samples >= 2
    assert result.busy.metrics_busy_max is not None
    assert result.order == pass_order([i.test_id for i in ITEMS], 9, 2)
    assert not [t for t in threading.enumerate() if t.name.startswith("bi-")]


def test_busy_source_falls_back_to_metrics_then_none() -> None:
    knobs = MockKnobs(token_delay_s=0.02, prompt_token_delay_s=0.001, slots_endpoint=False)
    with MockServer(parallel=4, knobs=knobs) as server:
        result = run_concurrent_pass(_Handle(server, True), TEMPLATE, ITEMS[:8], 4, 0, 0)
    assert result.busy_source == "metrics" and (result.server_busy_max or 0) >= 2
    knobs = MockKnobs(token_delay_s=0.01, slots_endpoint=False, metrics=False)
    with MockServer(parallel=4, knobs=knobs) as server:
        result = run_concurrent_pass(_Handle(server, True), TEMPLATE, ITEMS[:8], 4, 0, 0)
    assert result.busy_source == "none" and result.server_busy_max is None


def test_single_slot_server_overlaps_on_the_client_only() -> None:
    with MockServer(parallel=1, knobs=SLOW) as server:
        result = run_concurrent_pass(_Handle(server), TEMPLATE, ITEMS[:6], 4, 0, 0)
    # The client had several requests in flight, but the server never ran two at once.
    assert _max_depth(dict(result.responses)) >= 2
    assert result.server_busy_max == 1


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """Python's own SIGINT handler for the test: a shell that started the suite in the
    background hands it SIGINT ignored, and then no Ctrl-C would reach the code under test."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_interrupt_joins_every_thread() -> None:
    calls = []

    def interrupt_once(resp: RawResponse) -> None:
        calls.append(resp.test_id)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered to the main thread

    with MockServer(parallel=2, knobs=SLOW) as server, pytest.raises(KeyboardInterrupt):
        run_concurrent_pass(_Handle(server), TEMPLATE, ITEMS, 2, 0, 0, on_done=interrupt_once)
    assert len(calls) < len(ITEMS)  # stopped handing out work
    assert not [t for t in threading.enumerate() if t.name.startswith("bi-worker")]
    assert not [t for t in threading.enumerate() if t.name == "bi-busy-sampler" and t.is_alive()]


def test_the_sampler_settles_at_the_spec_bound_after_the_first_second() -> None:
    """Dense samples while a short pass may still be filling its slots, then one every 50 ms
    (the spec's bound): fewer wake-ups of the server's HTTP thread on a long pass."""
    sampler = _BusySampler((), SAMPLE_INTERVAL_S)
    assert sampler.interval_at(0.0) == sampler.interval_at(0.99) == SAMPLE_INTERVAL_S == 0.025
    assert sampler.interval_at(1.0) == sampler.interval_at(60.0) == SETTLED_INTERVAL_S == 0.05
    assert _BusySampler((), 0.2).interval_at(5.0) == 0.2  # a slower interval asked stays


def test_chains_send_a_conversations_turns_one_after_another_and_still_overlap() -> None:
    # Three two-turn conversations on four workers: turn 2 of each only once its turn 1 was
    # answered (the prompt cache can reuse it only then), yet the conversations overlap.
    chains = [("q00", "q01"), ("q02", "q03"), ("q04", "q05")]
    with MockServer(parallel=4, knobs=SLOW) as server:
        result = run_concurrent_pass(
            _Handle(server), TEMPLATE, ITEMS[:6], workers=4, pass_index=0, seed=0,
            chains=chains,
        )  # fmt: skip
    out = dict(result.responses)
    assert result.order == ("q00", "q01", "q02", "q03", "q04", "q05")
    for first, later in chains:
        done, sent = out[first].complete_ts, out[later].dispatch_ts
        assert done is not None and sent is not None and sent >= done
    assert _max_depth(out) >= 2


def test_chains_must_cover_every_item_once() -> None:
    with MockServer(parallel=2) as server, pytest.raises(ValueError, match="exactly once"):
        run_concurrent_pass(_Handle(server), TEMPLATE, ITEMS[:3], 2, 0, 0, chains=[("q00",)])


class _SlowMetrics(BaseHTTPRequestHandler):
    """A witness that answers late, as vLLM's API process does when its engine has the cores."""

    delay_s = 1.5

    def do_GET(self) -> None:
        time.sleep(self.delay_s)
        body = b"vllm:num_requests_running 3\n" if self.path == "/metrics" else b""
        self.send_response(200 if body else 500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def slow_witness() -> Iterator[str]:
    with serving(_SlowMetrics) as base:
        yield base


def test_a_late_witness_answer_still_counts_and_a_failed_one_is_counted(
    slow_witness: str,
) -> None:
    probes = (
        gauge_probe("metrics", slow_witness + "/metrics", "vllm:num_requests_running"),
        gauge_probe("broken", slow_witness + "/nothing", "vllm:num_requests_running"),
    )
    sampler = _BusySampler(probes, SAMPLE_INTERVAL_S)
    with requests.Session() as session:
        sampler.sample_once(session)
    busy = sampler.result()
    assert busy.busy_max == 3 and busy.source == "metrics"  # 1.5 s late, still evidence
    assert (busy.n_samples, busy.n_answered) == (1, 1)
    sampler = _BusySampler(probes[1:], SAMPLE_INTERVAL_S)
    with requests.Session() as session:
        sampler.sample_once(session)
    busy = sampler.result()
    assert busy.busy_max is None and (busy.n_samples, busy.n_answered) == (1, 0)


def _pool_items() -> tuple[WorkItem, ...]:
    """Ten short requests (100 cells each) and two long ones (700 each): in a pool of 1000,
    four shorts fit at once, a long one beside at most three shorts, never two long ones."""
    short = [
        WorkItem(f"s{i}", f"What is {i} + {i}?", None, str(2 * i), meta={"calibrated_tokens": 60})
        for i in range(10)
    ]
    long = [
        WorkItem(
            f"L{i}",
            "Read this. " * 40 + f"What is {i} * 3?",
            None,
            str(3 * i),
            meta={"calibrated_tokens": 660},
        )
        for i in range(2)
    ]
    return (*short, *long)


def _peak_cells(responses: dict[str, RawResponse], costs: dict[str, int]) -> int:
    return peak_held((r.dispatch_ts, r.complete_ts, costs[k]) for k, r in responses.items())


def test_a_unified_pool_is_never_asked_for_more_than_it_holds_and_long_rows_co_batch() -> None:
    from batch_invariance.core.kv_budget import kv_costs
    from batch_invariance.run.kv_gate import KvPool

    items = _pool_items()
    template = RequestTemplate("completions", n_predict=24, seed=0, timeout_s=10)
    costs = kv_costs(items, 24, 1000, 4)
    assert costs["L0"] == 700 and costs["s0"] == 100
    with MockServer(parallel=4, knobs=SLOW) as server:
        result = run_concurrent_pass(
            _Handle(server), template, items, workers=4, pass_index=0, seed=2,
            pool=KvPool(1000, 4, costs),
        )  # fmt: skip
        # Seed 2 shuffles both long requests to the head of the queue: without the pool's
        # rule, the barrier releases them together.
        ungated = run_concurrent_pass(_Handle(server), template, items, 4, 0, 2)
    responses = dict(result.responses)
    assert set(responses) == {i.test_id for i in items} and all(r.ok for r in responses.values())
    # Never more cells in flight than the pool holds (the same pass without the pool asks
    # for more: the rule is what keeps it in).
    assert _peak_cells(responses, costs) <= 1000 < _peak_cells(dict(ungated.responses), costs)
    # Each long request went out just before a short one that fits beside it, and ran
    # alongside another request: co-batched, as the witness saw (two busy slots or more).
    for long_id in ("L0", "L1"):
        mate = result.order[result.order.index(long_id) + 1]
        assert mate.startswith("s")
        mine = responses[long_id]
        assert any(
            (r.dispatch_ts or 0) < (mine.complete_ts or 0)
            and (mine.dispatch_ts or 0) < (r.complete_ts or 0)
            for k, r in responses.items()
            if k != long_id
        )
    assert (result.server_busy_max or 0) >= 2
