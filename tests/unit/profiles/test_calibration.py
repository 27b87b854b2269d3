"""Calibrating the spark work-set on the A server and handing that server to the driver.

Uses the loopback mock server (its ``/tokenize`` is a real HTTP tokenizer); the live suite does
the same against the real llama-server.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Literal

import pytest

from batch_invariance.core.evidence import OK
from batch_invariance.core.plan import Measurement
from batch_invariance.mock import MockKnobs, MockLauncher, tokenize
from batch_invariance.profiles.calibration import PrelaunchedLauncher
from batch_invariance.profiles.overrides import resolve_profile_run
from batch_invariance.profiles.tokens import server_token_counter
from batch_invariance.run.cell import CellPlan, run_cell
from batch_invariance.run.records import ServerHandle


def test_profile_cell_calibrates_on_the_a_server_and_launches_it_once() -> None:
    ctx = 4096
    run = resolve_profile_run("spark", None, None, {"corner": "short"}, env={})
    inner = MockLauncher(MockKnobs(token_delay_s=0.002, prompt_token_delay_s=0.0))
    with PrelaunchedLauncher(inner, ctx=ctx) as pre:
        counter = server_token_counter(pre.handle.base_url)
        workset = run.build_workset(ctx, counter)
        plan = CellPlan(
            items=workset.items,
            ctx=ctx,
            parallel=2,
            measurement=Measurement(gate_passes=1, n_predict=8),
        )
        cell = run_cell(plan, pre, run.scorer)
    # Calibration used the A server itself: two launches in all (A, then B/C), not three.
    assert inner.launches == 2
    for item in workset.items:
        assert item.prompt is not None and item.fill is not None
        target = round(item.fill * ctx)
        assert abs(len(tokenize(item.prompt)) - target) <= 0.03 * target
    evidence = cell.evidence
    assert set(evidence.a) == {i.test_id for i in workset.items}
    # The driver filled prompt_tokens_measured from the server for every genuinely run trial.
    assert all(t.prompt_tokens_measured for t in evidence.a.values() if t.failure_mode == OK)


def test_held_server_is_torn_down_when_calibration_fails() -> None:
    inner = MockLauncher()
    with pytest.raises(ZeroDivisionError), PrelaunchedLauncher(inner, ctx=512) as pre:
        server = inner.servers[0]
        assert pre.handle.base_url
        raise ZeroDivisionError
    with pytest.raises(RuntimeError):
        _ = pre.handle
    # The mock server was stopped: its health check now fails.
    with pytest.raises(Exception):  # noqa: B017 - any InfraError-like failure will do
        server.check_alive()


class _Recorder:
    """A launcher that records what it was asked for (no servers)."""

    source: Literal["live", "mock"] = "mock"

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.exits = 0

    def launch(self, arm: str, parallel: int, ctx: int) -> AbstractContextManager[ServerHandle]:
        self.calls.append((arm, parallel, ctx))
        return self._cm()

    @contextmanager
    def _cm(self) -> Iterator[ServerHandle]:
        try:
            yield object()  # type: ignore[misc]
        finally:
            self.exits += 1


def test_only_the_first_matching_launch_gets_the_held_server() -> None:
    rec = _Recorder()
    with PrelaunchedLauncher(rec, ctx=1024) as pre:
        held = pre.handle
        with pre.launch("A", 1, 1024) as first:
            assert first is held
        assert rec.exits == 1  # the driver's exit tore the held server down
        with pre.launch("A", 1, 1024):
            pass
        with pre.launch("BC", 4, 1024):
            pass
    assert rec.calls == [("A", 1, 1024), ("A", 1, 1024), ("BC", 4, 1024)]
    assert rec.exits == 3
