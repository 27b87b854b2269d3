"""The search over the loopback mock: it walks the declared space through run-live's own
service, a probe only rejects, the defaults always get their cert, a second run reuses the
certs already measured, and the budget stops it with what it measured (no partial cert)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

import pytest

from batch_invariance.core.evidence import GatePolicy
from batch_invariance.core.plan import Measurement
from batch_invariance.core.roles import ServerRole
from batch_invariance.engines.base import KvLayout
from batch_invariance.engines.registry import ENGINES
from batch_invariance.engines.search_space import SearchConfig
from batch_invariance.errors import InfraError
from batch_invariance.mock import MockKnobs, MockLauncher
from batch_invariance.run.records import ServerHandle
from batch_invariance.service.request import LiveRequest
from batch_invariance.service.search import (
    SEARCH_FILE,
    SearchOutcome,
    SearchRequest,
    prepare_search,
    run_search,
)
from batch_invariance.service.target import LauncherFactory
from tests.support.fakes_live import fake_cell_files

#: Loose on answer length, distinct prompts and slot fill: the mock answers in a few tokens.
POLICY = GatePolicy(min_answer_tokens=1, max_bound=1.0, min_slot_fill=0.0)
#: What each configuration's mock server does: the defaults and -fa on change answers when
#: co-batched; -ub 1 does not.
DRIFTS = {"defaults": True, "fa-on": True, "ub1": False}


@dataclass
class MockLive:
    """The mock as a live cell's launcher (no memory guard, no launch records)."""

    inner: MockLauncher
    launches: list[Any] = field(default_factory=list)
    aborted: str | None = None
    source: Literal["live", "mock"] = "mock"
    started: list[str] = field(default_factory=list)
    #: The KV layout it labels its servers with, as llama-server's launcher does.
    layout: KvLayout = "split"

    def guard_decision(self, *args: Any, **kwargs: Any) -> None:
        return None

    @contextmanager
    def launch(self, role: ServerRole, parallel: int, ctx: int) -> Iterator[ServerHandle]:
        self.started.append(f"{role}:{parallel}")
        label = ENGINES["llama-server"].kv_label(ctx, parallel, self.layout)
        with self.inner.launch(role, parallel, ctx) as handle:
            yield replace(handle, kv_label=label)


@dataclass
class Clock:
    t: float = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Launchers:
    """Each configuration's mock, counting the servers every search started."""

    started: list[str] = field(default_factory=list)
    #: The search's clock: every cell launched moves it 100 s.
    clock: Clock = field(default_factory=lambda: Clock())
    #: Configurations whose server does not start.
    failing: tuple[str, ...] = ()

    def __call__(self, config: SearchConfig) -> LauncherFactory:
        # The mock's own decode pace co-batches the concurrent passes, as in the run's tests;
        # the REDs asserted below need that, so a pace too quick to co-batch fails them.
        knobs = MockKnobs(cobatch_divergence=DRIFTS[config.name], prompt_token_delay_s=0.0)

        def factory(*_: Any) -> MockLive:
            if config.name in self.failing:
                raise InfraError(f"llama-server exited at start ({config.name}, test)")
            self.clock.t += 100.0
            live = MockLive(MockLauncher(knobs), layout=config.kv_layout)
            live.started = self.started
            return live

        return cast(LauncherFactory, factory)  # the mock stands in for the engine's launcher


def _workset(path: Path) -> Path:
    # Prompts of growing length: the probe keeps those past 256 (by its length estimate)
    # and the longest.
    rows = [{"id": f"p{i}", "prompt": " ".join(["word"] * (60 * i + 10))} for i in range(12)]
    path.write_text(json.dumps(rows))
    return path


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    made = fake_cell_files(tmp_path, monkeypatch, rows=3)
    made["ws"] = _workset(tmp_path / "ladder.json")
    return made


def _request(files: dict[str, Path], budget: float | None = None) -> SearchRequest:
    cell = LiveRequest(
        out_dir=files["out"], server_bin=files["bin"], model=files["model"],
        workset=files["ws"], ctx=1024, parallel=2,
        measurement=Measurement(gate_passes=2, reps=1, n_predict=128, req_timeout=30.0,
                                stop_on_red=True),
        policy=POLICY,
    )  # fmt: skip
    return SearchRequest(cell, only=("ub1", "fa-on"), budget_s=budget)


def _search(files: dict[str, Path], launchers: Launchers, **kw: Any) -> SearchOutcome:
    return run_search(
        prepare_search(_request(files, kw.pop("budget", None))), launchers=launchers, **kw
    )


def _rows(outcome: SearchOutcome) -> dict[str, dict[str, Any]]:
    return {r["config"]: r for r in outcome.record["rows"]}


def test_the_walk_probes_first_and_certifies_only_what_the_probe_did_not_reject(
    files: dict[str, Path],
) -> None:
    outcome = _search(files, Launchers())
    rows = _rows(outcome)
    assert list(rows) == ["defaults", "ub1", "fa-on"]
    # fa-on: rejected by its probe, with its evidence, and no full cert measured.
    assert rows["fa-on"]["verdict"] == "RED (probe)"
    assert rows["fa-on"]["cert"] is None and rows["fa-on"]["probe"]["verdict"] == "RED"
    assert not list((files["out"] / "fa-on").glob("*.json"))
    # The defaults: their full cert runs whatever the probe said (the positive control).
    assert rows["defaults"]["verdict"] == "RED"
    assert rows["defaults"]["cert"] is not None
    assert outcome.record["control_red"] is True
    # ub1: its probe saw nothing, so the full cert decides, through run-live's own cert.
    assert rows["ub1"]["probe"]["verdict"] != "RED"
    cert = json.loads(Path(rows["ub1"]["cert"]["path"]).read_text())
    # The folder a deploy's serve --certs reads holds the full cert alone (no probe cert).
    assert list(Path(rows["ub1"]["certs"]).rglob("*.json")) == [Path(rows["ub1"]["cert"]["path"])]
    assert cert["provenance"]["driver"] == "search"
    assert cert["provenance"]["server_flags"] == ["-ub", "1"]
    assert rows["ub1"]["verdict"] == cert["verdict"]
    # A mock cert is never promotable: no fastest GREEN, and the table says so.
    assert outcome.record["fastest_green"] is None
    assert "no configuration is promotable GREEN" in outcome.record["answer"]
    assert (files["out"] / SEARCH_FILE).is_file()


def test_a_second_run_reuses_every_cert_of_the_same_configuration(files: dict[str, Path]) -> None:
    first = Launchers()
    _search(files, first)
    assert first.started
    again = Launchers()
    outcome = _search(files, again)
    assert again.started == []  # nothing measured again
    rows = _rows(outcome)
    assert rows["defaults"]["cert"]["reused"] and rows["ub1"]["cert"]["reused"]
    assert rows["fa-on"]["probe"]["reused"]


def test_a_cert_of_other_flags_is_not_reused(files: dict[str, Path]) -> None:
    _search(files, Launchers())
    # The ub1 folder's cert now stands where another configuration's would: it is not reused
    # for a cell whose flags differ (the identity includes the options).
    ub1 = files["out"] / "ub1"
    other = files["out"] / "defaults"
    for cert in other.glob("*.json"):
        cert.unlink()
    for cert in ub1.glob("*.json"):
        (other / cert.name).write_bytes(cert.read_bytes())
    again = Launchers()
    outcome = _search(files, again)
    assert not _rows(outcome)["defaults"]["cert"]["reused"]
    assert again.started  # the defaults were measured again


def test_the_budget_stops_with_what_was_measured_and_no_partial_cert(
    files: dict[str, Path],
) -> None:
    launchers = Launchers()
    # Each cell takes 100 s by the clock: after the defaults' probe, the next probe (100 s by
    # the probes so far) does not fit in 150 s.
    outcome = _search(files, launchers, budget=150.0, now=launchers.clock)
    rows = _rows(outcome)
    assert outcome.stopped is not None and "budget 150 s" in outcome.stopped
    assert outcome.record["stopped"] == outcome.stopped
    assert rows["defaults"]["probe"] is not None and rows["defaults"]["cert"] is None
    for name in ("ub1", "fa-on"):
        assert rows[name]["probe"] is None and "budget" in str(rows[name]["not_run"])
        assert not list(Path(rows[name]["certs"]).rglob("*.json"))


def test_a_probe_that_saw_no_drift_is_never_certified_green(files: dict[str, Path]) -> None:
    launchers = Launchers()
    # Room for both probes and the defaults' cert, not for ub1's cert: its probe saw no drift
    # and nothing else measured it.
    request = _request(files, budget=250.0)
    job = prepare_search(SearchRequest(request.cell, ("ub1",), 250.0))
    outcome = run_search(job, launchers=launchers, now=launchers.clock)
    row = _rows(outcome)["ub1"]
    assert row["probe"] is not None and row["probe"]["verdict"] != "RED"
    assert row["cert"] is None
    assert row["verdict"] == "not certified (probe saw no drift)"
    assert "budget" in str(row["not_run"])
    assert outcome.record["fastest_green"] is None


def test_a_configuration_whose_server_fails_ends_its_row_not_the_search(
    files: dict[str, Path],
) -> None:
    outcome = _search(files, Launchers(failing=("fa-on",)), budget=150.0)
    rows = _rows(outcome)
    assert rows["fa-on"]["not_run"] == ("probe failed: llama-server exited at start (fa-on, test)")
    assert rows["fa-on"]["verdict"] == "not run"
    assert rows["defaults"]["probe"] is not None  # the others went on
