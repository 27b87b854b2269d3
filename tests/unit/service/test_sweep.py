"""The sweep: one shared reference, 1 + K launches, a cert per N that verifies on its own,
sweep.json with max_safe_parallel, and N values the memory guard refuses named, not run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from batch_invariance.cert.provenance import Provenance
from batch_invariance.cert.verify import verify
from batch_invariance.cli import main
from batch_invariance.core.evidence import CellSpec, GatePolicy
from batch_invariance.core.plan import CellPlan, Measurement, WorkItem
from batch_invariance.core.sweep import (
    SweepPoint,
    max_safe_faster_parallel,
    max_safe_parallel,
    median_first_divergence,
)
from batch_invariance.errors import UsageError
from batch_invariance.host import memory
from batch_invariance.host.gguf import parse_info
from batch_invariance.mock import MockKnobs, MockLauncher
from batch_invariance.run.cell import run_cells
from batch_invariance.run.progress import NullProgress
from batch_invariance.run.records import CellRun, ServerHandle
from batch_invariance.run.workset import bundled_workset_path, load_workset
from batch_invariance.scorer_api import ExactMatchScorer
from batch_invariance.service.finish import finish_cell
from batch_invariance.service.sweep import parse_parallels
from batch_invariance.service.sweep_summary import SweepCell, sweep_summary
from tests.support.fakes_live import LOOSE_GATES, fake_cell_files

#: Loose on answer length and distinct prompts: the mock answers in a few tokens, 16 prompts.
POLICY = GatePolicy(min_answer_tokens=1, max_bound=1.0, min_slot_fill=0.0)


@dataclass
class CountingLauncher:
    inner: MockLauncher
    calls: list[tuple[str, int]] = field(default_factory=list)
    source: Literal["live", "mock"] = "mock"

    @contextmanager
    def launch(self, arm: str, parallel: int, ctx: int) -> Iterator[ServerHandle]:
        self.calls.append((arm, parallel))
        with self.inner.launch(arm, parallel, ctx) as handle:
            yield handle


def _plans(parallels: tuple[int, ...], stop_on_red: bool = False) -> list[CellPlan]:
    items: tuple[WorkItem, ...] = load_workset(bundled_workset_path("mock")).items
    measured = Measurement(gate_passes=3, n_predict=16, req_timeout=30.0, stop_on_red=stop_on_red)
    return [CellPlan(items=items, ctx=512, parallel=n, measurement=measured) for n in parallels]


def _sweep(
    tmp_path: Path, knobs: MockKnobs, parallels: tuple[int, ...], stop_on_red: bool = False
) -> tuple[CountingLauncher, list[SweepCell]]:
    launcher = CountingLauncher(MockLauncher(knobs))
    cells: list[SweepCell] = []

    def finish(run: CellRun) -> None:
        n = run.plan.parallel
        spec = CellSpec(model="mock", ctx=512, dispatch_n=n, kv_label=run.kv_label, reps=1)
        done = finish_cell(run, spec, POLICY, Provenance(tool_version="test"), tmp_path)
        cells.append(SweepCell(n, done, verify(done.path), None))

    run_cells(_plans(parallels, stop_on_red), launcher, ExactMatchScorer(), POLICY,
                     NullProgress(), finish)  # fmt: skip
    return launcher, cells


def test_a_sweep_shares_arm_a_and_launches_one_server_per_n(tmp_path: Path) -> None:
    launcher, cells = _sweep(tmp_path, MockKnobs(), (2, 4))
    # 1 + K launches: the shared A server, then one --parallel N server per N.
    assert launcher.calls == [("A", 1), ("BC", 2), ("BC", 4)]
    assert [c.parallel for c in cells] == [2, 4]
    for c in cells:
        assert c.finished is not None and c.verification is not None
        assert c.verification.problems == ()  # every cert re-derives on its own
        assert c.finished.cert.verdict == "GREEN"
        schedule = c.finished.cert.provenance.schedule
        assert schedule is not None and schedule.reference_shared is not None
        assert "shared by the cells N=2, 4" in schedule.reference_shared
    a2, a4 = (c.finished.cert.evidence.a for c in cells if c.finished)
    assert a2 == a4  # the same ground truth in both certs


def test_an_a_repeat_run_for_one_n_is_shared_by_the_later_ones(tmp_path: Path) -> None:
    launcher, cells = _sweep(tmp_path, MockKnobs(divergence_probability=0.3, seed=5), (2, 4))
    assert launcher.calls == [("A", 1), ("BC", 2), ("A", 1), ("BC", 4)]
    for c in cells:
        assert c.finished is not None and c.finished.cert.evidence.a_repeat is not None
        assert c.verification is not None and c.verification.problems == ()


def test_stop_on_red_in_a_sweep_cuts_every_red_cell_short(tmp_path: Path) -> None:
    _, cells = _sweep(tmp_path, MockKnobs(cobatch_divergence=True), (2, 4), stop_on_red=True)
    for c in cells:
        assert c.finished is not None and c.finished.cert.verdict == "RED"
        assert c.finished.cert.n_passes == 1
        assert c.verification is not None and c.verification.problems == ()


def test_the_summary_lists_every_n_with_its_cert_and_digest(tmp_path: Path) -> None:
    _, cells = _sweep(tmp_path, MockKnobs(cobatch_divergence=True), (2,), stop_on_red=True)
    refused = SweepCell(8, None, None, "not run: projected 9.00 GiB > cap 4.00 GiB")
    summary = sweep_summary("mock", 512, [*cells, refused], launches=2)
    entry, skipped = summary["cells"]
    assert entry["verdict"] == "RED" and entry["rate"]["kind"] == "observed"
    assert entry["stopped_early"] is True and entry["passes_run"] == 1
    assert entry["throughput"]["speedup"] is not None
    assert cells[0].finished is not None
    assert summary["certs"] == [
        {"parallel": 2, "file": cells[0].finished.path.name,
         "digest": cells[0].finished.cert.digest}
    ]  # fmt: skip
    assert skipped == {"parallel": 8, "ran": False, "not_run": refused.not_run}
    assert summary["not_run"] == {"8": refused.not_run}
    assert summary["max_safe_parallel"] is None  # a mock cert is never promotable


def test_max_safe_parallel_needs_every_smaller_n_green() -> None:
    p = SweepPoint
    assert max_safe_parallel([p(2, True), p(4, True), p(8, False)]) == 4
    assert max_safe_parallel([p(8, True), p(2, True), p(4, True)]) == 8
    assert max_safe_parallel([p(2, True), p(4, False), p(8, True)]) == 2
    assert max_safe_parallel([p(2, False), p(4, True)]) is None
    assert max_safe_parallel([]) is None


def test_max_safe_faster_parallel_is_the_largest_safe_n_faster_than_serial() -> None:
    p = SweepPoint
    # N=4 is safe but buys 0.90x: the largest N both safe and faster than N=1 is 2.
    slow_top = [p(2, True, 1.7), p(4, True, 0.9), p(8, False, 3.0)]
    assert max_safe_parallel(slow_top) == 4
    assert max_safe_faster_parallel(slow_top) == 2
    assert max_safe_faster_parallel([p(2, True, 1.5), p(4, True, 2.5)]) == 4
    # Faster but not safe does not count; neither does a ratio of exactly 1 or none measured.
    assert max_safe_faster_parallel([p(2, True, 1.0), p(4, True, None), p(8, False, 3)]) is None
    assert max_safe_faster_parallel([p(2, False, 2.0)]) is None
    assert max_safe_faster_parallel([]) is None


def test_the_first_divergent_token_is_the_median_over_ids_of_their_earliest() -> None:
    rows = [("a", 5), ("a", 2), ("b", 10), ("c", None), ("d", 4)]
    assert median_first_divergence(rows) == 4.0  # a: 2, b: 10, d: 4
    assert median_first_divergence([("a", None)]) is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [("2,x", "comma"), ("", "at least one"), ("2,2", "at most once"), ("1,4", ">= 2")],
)
def test_bad_parallel_lists_are_usage_errors(text: str, needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        parse_parallels(text)
    assert parse_parallels("8, 2,4") == (2, 4, 8)


@pytest.fixture()
def fake_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    return fake_cell_files(tmp_path, monkeypatch, rows=3)


def _sweep_argv(cell: dict[str, Path], *extra: str) -> list[str]:
    return ["sweep", "--server-bin", str(cell["bin"]), "--model", str(cell["model"]),
            "--workset", str(cell["ws"]), "--out-dir", str(cell["out"]), *LOOSE_GATES,
            *extra]  # fmt: skip


def test_an_n_that_does_not_fit_is_named_not_run_and_never_launched(
    fake_cell: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    info = parse_info(fake_cell["model"])
    fits = memory.project(info, 32768, 2, ()).total_bytes
    too_big = memory.project(info, 32768, 8, ()).total_bytes
    cap_gb = (fits + too_big) / 2 / memory.GIB
    out = fake_cell["out"]
    cap = f"{cap_gb:.6f}"
    numbers = ["--ctx", "32768", "--parallel", "8,2", "--gate-passes", "1", "--reps", "1"]
    code = main(_sweep_argv(fake_cell, *numbers, "--max-footprint-gb", cap, "--req-timeout", "5"))
    text = capsys.readouterr().out
    # The fake server answers no completions: the N=2 cell is UNVERIFIED (exit 3), not GREEN.
    assert code == 3, text
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["parallel"] == [2, 8]
    assert summary["not_run"]["8"].startswith("not run: projected ")
    assert "GiB > cap" in summary["not_run"]["8"]
    launched = fake_cell["marker"].read_text().splitlines()
    assert not any("--parallel 8" in line for line in launched)
    assert summary["server_launches"] == len(launched)
    assert [c["file"] for c in summary["certs"]] == ["tiny__ctx32768__N2.json"]
    assert verify(out / "tiny__ctx32768__N2.json").problems == ()
    assert "max_safe_parallel = None" in text and "N=8   not run" in text


def test_a_sweep_whose_reference_cannot_fit_launches_nothing(
    fake_cell: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(_sweep_argv(fake_cell, "--ctx", "512", "--parallel", "2,4",
                            "--max-footprint-gb", "0.0001"))  # fmt: skip
    assert code == 2
    assert "GuardRefused" in capsys.readouterr().err
    assert not fake_cell["marker"].exists()


def test_an_n_whose_vllm_reservation_cannot_be_made_is_named_as_not_run(tmp_path: Path) -> None:
    from batch_invariance.host.node_memory import NodeMemory
    from batch_invariance.service.sweep import guard_refusal
    from tests.unit.servers.test_memory_reservation import host_with, vllm_launcher

    launcher = vllm_launcher(tmp_path)
    tight = host_with(NodeMemory(0, 16 * memory.GIB, 2 * memory.GIB))
    note = guard_refusal(launcher, 2048, 4, tight)
    assert note is not None and note.startswith("not run: --gpu-memory-utilization 0.")
    assert "exit at start" in note
    assert guard_refusal(launcher, 2048, 4, host_with()) is None


@pytest.mark.parametrize("command", ["sweep", "run-live"])
def test_without_a_workset_the_plan_is_the_length_ladder_of_the_slot(
    fake_cell: dict[str, Path], capsys: pytest.CaptureFixture[str], command: str
) -> None:
    argv = [command, "--server-bin", str(fake_cell["bin"]), "--model", str(fake_cell["model"]),
            "--out-dir", str(fake_cell["out"]), "--ctx", "1024", "--parallel", "2",
            "--n-predict", "96", "--endpoint", "completions", "--dry-run"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    plan = capsys.readouterr().out
    assert "work-set: length ladder, 32 distinct prompts" in plan
    assert "(quarter bands: band1 8, band2 8, band3 8, band4 8)" in plan
    assert "a GREEN needs measured sequences >= 768 (3/4 of the slot)" in plan
    assert not fake_cell["marker"].exists()  # nothing launched
    # A slot the ladder cannot fill is refused before anything starts, naming the smallest.
    small = [*argv[:7], "--ctx", "256", "--parallel", "2", "--n-predict", "200", "--dry-run"]
    assert main(small) == 2
    assert "the smallest ctx it can fill is" in capsys.readouterr().err
