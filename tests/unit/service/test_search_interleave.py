"""The search's interleaved comparison over the loopback mock: only a promotable GREEN is set
against the defaults, one server at a time, the order turned every round, the same prompts on
both sides; the figure is the median of the rounds' ratios; the budget stops it; a second run
reuses it for the same two certs and measures it again for another."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from batch_invariance.cert.store import atomic_write_text
from batch_invariance.core.roles import ServerRole
from batch_invariance.core.search import Measured, SearchRow
from batch_invariance.engines.search_space import SearchConfig
from batch_invariance.mock import MockKnobs, MockLauncher
from batch_invariance.run.records import ServerHandle
from batch_invariance.service.search import SEARCH_FILE, SearchJob, SearchRequest, prepare_search
from batch_invariance.service.search_interleave import (
    PROBE_WORKSET,
    InterleaveRun,
    StepClock,
    interleave_greens,
)
from batch_invariance.service.search_record import previous_interleaved, search_record
from batch_invariance.service.target import LauncherFactory
from tests.unit.service.test_search import Clock, Launchers, MockLive, _request, _search, files

__all__ = ["files"]  # the fixture, shared with the search's own tests

#: Each configuration's mock decodes at its own pace: -ub 1 at half the defaults' rate.
DELAY_S = {"defaults": 0.002, "ub1": 0.004, "fa-on": 0.002}


@dataclass
class Logged(MockLive):
    """The mock launcher, logging every server's start and stop with its configuration."""

    name: str = ""
    events: list[tuple[str, ...]] = field(default_factory=list)

    @contextmanager
    def launch(self, role: ServerRole, parallel: int, ctx: int) -> Iterator[ServerHandle]:
        self.events.append(("start", self.name, str(role), str(parallel)))
        try:
            with self.inner.launch(role, parallel, ctx) as handle:
                yield handle
        finally:
            self.events.append(("stop", self.name))


@dataclass
class Recording:
    events: list[tuple[str, ...]] = field(default_factory=list)
    clock: Clock = field(default_factory=Clock)

    def __call__(self, config: SearchConfig) -> LauncherFactory:
        knobs = MockKnobs(token_delay_s=DELAY_S[config.name], prompt_token_delay_s=0.0)

        def factory(*_: Any) -> Logged:
            self.clock.t += 100.0
            return Logged(MockLauncher(knobs), name=config.name, events=self.events)

        return cast(LauncherFactory, factory)


def _seen(path: Path, verdict: str, promotable: bool) -> Measured:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(f"{verdict} cert of {path.parent.name}\n")
    return Measured(path=str(path), valid=True, verdict=verdict, promotable=promotable,
                    slot_ctx=1024, longest=900, first_drift_position=None,
                    bitwise_equal_up_to=None, speedup=1.0,
                    concurrent_tokens_per_s=50.0)  # fmt: skip


def _job(files: dict[str, Path], rounds: int = 3) -> SearchJob:
    request = _request(files)
    job = prepare_search(SearchRequest(request.cell, ("ub1", "fa-on"), None, rounds))
    defaults = next(p for p in job.points if p.config.is_defaults)
    defaults.probe.out_dir.mkdir(parents=True, exist_ok=True)
    # The defaults' probe's prompts, as its run writes them: the batch both sides send.
    (defaults.probe.out_dir / PROBE_WORKSET).write_text(files["ws"].read_text())
    return job


def _rows(job: SearchJob) -> dict[str, SearchRow]:
    """The defaults RED, -ub 1 a promotable GREEN, -fa on a GREEN that is not promotable."""
    out = job.out_dir
    return {
        "defaults": SearchRow("defaults", "(defaults)", True,
                              cert=_seen(out / "defaults" / "c.json", "RED", False)),
        "ub1": SearchRow("ub1", "-ub 1", False, cert=_seen(out / "ub1" / "c.json", "GREEN", True)),
        "fa-on": SearchRow("fa-on", "-fa on", False,
                           cert=_seen(out / "fa-on" / "c.json", "GREEN", False)),
    }  # fmt: skip


def _interleave(
    job: SearchJob, rows: dict[str, SearchRow], launchers: Recording, budget: float | None = None
) -> str | None:
    path = job.out_dir / SEARCH_FILE
    previous = previous_interleaved(path)

    def write(now: dict[str, SearchRow]) -> None:
        record = search_record("m", 1024, 2, "llama-server", list(now.values()), stopped=None,
                               wall_s=0.0)  # fmt: skip
        atomic_write_text(path, json.dumps(record) + "\n")

    clock = StepClock(launchers.clock, budget)
    run = InterleaveRun(job.interleave_rounds, job.out_dir, clock, launchers, previous,
                        lambda _: None, write)  # fmt: skip
    return interleave_greens(job.points, rows, run)


def _servers(events: list[tuple[str, ...]]) -> list[str]:
    """The configurations in the order their servers ran, checking that each stopped before
    the next started (never two up at once)."""
    order = []
    for start, stop in zip(events[::2], events[1::2], strict=True):
        assert start[0] == "start" and stop == ("stop", start[1]), events
        assert start[2:] == (str(ServerRole.BC), "2")  # the concurrent server at the cell's N
        order.append(start[1])
    return order


def test_only_a_promotable_green_is_interleaved_one_server_at_a_time_the_order_turning(
    files: dict[str, Path],
) -> None:
    job = _job(files)
    rows = _rows(job)
    launchers = Recording()
    assert _interleave(job, rows, launchers) is None
    # Rounds 1 and 3: -ub 1 first; round 2: the defaults first.
    assert _servers(launchers.events) == ["ub1", "defaults", "defaults", "ub1", "ub1", "defaults"]
    assert rows["fa-on"].interleaved is None  # GREEN, but not promotable
    assert rows["defaults"].interleaved is None
    found = rows["ub1"].interleaved
    assert found is not None and found.complete and not found.reused
    assert [r.config_first for r in found.rounds] == [True, False, True]
    for r in found.rounds:
        assert r.config_tps and r.defaults_tps
        assert r.ratio == round(r.config_tps / r.defaults_tps, 3)
    assert found.median == statistics.median(r.ratio for r in found.rounds if r.ratio)
    assert found.median is not None and found.median < 1.0  # -ub 1's mock decodes slower
    # The record carries each round and the median; the table reads the median.
    record = json.loads((job.out_dir / SEARCH_FILE).read_text())
    ub1 = next(r for r in record["rows"] if r["config"] == "ub1")
    assert ub1["interleaved"]["median_ratio"] == found.median
    assert [r["order"] for r in ub1["interleaved"]["rounds"]] == [
        ["ub1", "defaults"], ["defaults", "ub1"], ["ub1", "defaults"]
    ]  # fmt: skip


def test_without_a_promotable_green_nothing_is_interleaved(files: dict[str, Path]) -> None:
    job = _job(files)
    rows = _rows(job)
    rows["ub1"] = SearchRow("ub1", "-ub 1", False, cert=_seen(job.out_dir / "x.json", "RED", False))
    launchers = Recording()
    assert _interleave(job, rows, launchers) is None
    assert launchers.events == [] and all(r.interleaved is None for r in rows.values())
    # And a whole search over the mock (whose certs are never promotable) starts no server
    # for it and writes no figure.
    outcome = _search(files, Launchers())
    assert all(r["interleaved"] is None for r in outcome.record["rows"])
    assert not (files["out"] / "interleave").exists()


def test_zero_rounds_turns_it_off(files: dict[str, Path]) -> None:
    job = _job(files, rounds=0)
    rows = _rows(job)
    launchers = Recording()
    assert _interleave(job, rows, launchers) is None
    assert launchers.events == [] and rows["ub1"].interleaved is None


def test_the_budget_stops_the_rounds_with_what_they_measured(files: dict[str, Path]) -> None:
    job = _job(files)
    rows = _rows(job)
    launchers = Recording()
    # Each server start moves the clock 100 s: round 1 takes 200 s, round 2 would end at 400.
    stopped = _interleave(job, rows, launchers, budget=300.0)
    assert stopped == "budget 300 s reached after 200 s"
    found = rows["ub1"].interleaved
    assert found is not None and len(found.rounds) == 1 and not found.complete
    assert found.stopped == stopped and found.median == found.rounds[0].ratio
    assert len(_servers(launchers.events)) == 2


def test_a_second_run_reuses_the_figure_only_for_the_same_certs(files: dict[str, Path]) -> None:
    job = _job(files)
    _interleave(job, _rows(job), Recording())
    again = Recording()
    rows = _rows(job)
    _interleave(job, rows, again)
    assert again.events == []  # the same two certs: nothing measured again
    found = rows["ub1"].interleaved
    assert found is not None and found.reused and found.complete
    # The defaults' cert measured again (another file): the figure is measured again too.
    Path(job.out_dir / "defaults" / "c.json").write_text("RED cert, measured again\n")
    third = Recording()
    rows = _rows(job)
    _interleave(job, rows, third)
    assert len(_servers(third.events)) == 6
    assert rows["ub1"].interleaved is not None and not rows["ub1"].interleaved.reused


def test_a_stopped_figure_is_measured_again(files: dict[str, Path]) -> None:
    job = _job(files)
    _interleave(job, _rows(job), Recording(), budget=300.0)
    again = Recording()
    rows = _rows(job)
    _interleave(job, rows, again)
    assert len(_servers(again.events)) == 6


@pytest.mark.parametrize("rounds", [-1])
def test_negative_rounds_are_a_usage_error(files: dict[str, Path], rounds: int) -> None:
    from batch_invariance.errors import UsageError

    with pytest.raises(UsageError, match="--interleave-rounds -1"):
        _job(files, rounds=rounds)


def test_the_dry_run_counts_the_rounds(files: dict[str, Path]) -> None:
    from batch_invariance.core.plan import batch_eta_seconds
    from batch_invariance.service.dry_run import usable_cpus
    from batch_invariance.service.search_interleave import interleave_plan

    job = _job(files)
    first = job.points[0].full
    assert first.target.gguf is not None
    side = batch_eta_seconds(first.target.gguf.file_size, 2, n_predict=128, cpus=usable_cpus())
    line, eta = interleave_plan(job.points, 3)
    assert "3 round(s) of one server at a time, 2 requests each" in line
    assert eta == pytest.approx(3 * 2 * side)
    assert interleave_plan(job.points, 0)[1] == 0.0


def test_a_search_sets_its_promotable_green_against_the_defaults_after_the_certs(
    files: dict[str, Path],
) -> None:
    from dataclasses import replace

    from batch_invariance.report.search_text import search_text
    from batch_invariance.service.search import run_search
    from tests.support.deploy_world import MODEL, _live_cert, _provenance

    model = files["model"].with_name(f"{MODEL}.gguf")  # the name the factory cert records
    model.write_bytes(files["model"].read_bytes())
    job = prepare_search(SearchRequest(replace(_request(files).cell, model=model), ("ub1",),
                                       None, 2))  # fmt: skip
    # -ub 1's folder already holds a promotable GREEN of this very cell (the mock's own
    # certs never are): the search reuses it, and interleaves it after the defaults' cert.
    ub1 = next(p.full for p in job.points if p.config.name == "ub1")
    measured = {**_provenance(model, 2, "split", binary=files["bin"]),
                "server_flags": ["-ub", "1"]}  # fmt: skip
    _live_cert(ub1.out_dir, model, provenance=measured, parallel=2, ctx=1024)
    launchers = Launchers()
    outcome = run_search(job, launchers=launchers)
    rows = {r["config"]: r for r in outcome.record["rows"]}
    assert rows["ub1"]["cert"]["reused"] and rows["ub1"]["cert"]["promotable"]
    assert outcome.record["fastest_green"] == "ub1"
    found = rows["ub1"]["interleaved"]
    assert [r["order"] for r in found["rounds"]] == [["ub1", "defaults"], ["defaults", "ub1"]]
    assert found["median_ratio"] is not None and rows["defaults"]["interleaved"] is None
    # After the defaults' probe and cert and -ub 1's probe: four concurrent servers, one each.
    assert launchers.started[-4:] == ["BC:2"] * 4 and len(launchers.started) == 10
    table = search_text(outcome.record, str(outcome.path), None)
    assert f"{found['median_ratio']:.2f}x " in next(x for x in table.splitlines()
                                                    if x.startswith("ub1 "))  # fmt: skip
