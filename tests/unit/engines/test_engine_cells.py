"""Whole cells on other engines: vLLM and SGLang protocol fakes launched as processes, and
attach mode against a server the test started itself."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from batch_invariance.cert.certificate import is_promotable
from batch_invariance.cert.provenance import Provenance
from batch_invariance.core.evidence import CellSpec
from batch_invariance.core.roles import ServerRole
from batch_invariance.core.verdict import decide
from batch_invariance.engines.registry import engine_for
from batch_invariance.errors import InfraError, UsageError
from batch_invariance.mock import MockKnobs, MockServer
from batch_invariance.run.cell import run_cell
from batch_invariance.run.records import ArmStats, CellRun
from batch_invariance.scorer_api import ExactMatchScorer
from batch_invariance.servers import ports
from batch_invariance.servers.attach import ARM_A_NOTE, AttachLauncher, attach_target
from batch_invariance.servers.launch import EngineLauncher
from batch_invariance.service.finish import finish_cell
from tests.support import engine_fakes
from tests.support.engine_fakes import fake_engine
from tests.support.fakes_live import fake_settings
from tests.unit.run.test_cell import ITEMS, POLICY, plan


def stand_in(tmp_path: Path, name: str) -> Path:
    """An executable named like the engine's command that runs the protocol fake (with the
    test's ``FAKE_*`` settings of the moment it is written)."""
    exe = tmp_path / name
    exe.write_text(
        f"#!{sys.executable}\n{fake_settings()}import runpy\n"
        f"runpy.run_path({engine_fakes.__file__!r}, run_name='__main__')\n"
    )
    exe.chmod(0o755)
    return exe


def launcher(
    tmp_path: Path, engine: str, monkeypatch: pytest.MonkeyPatch, **env: str
) -> EngineLauncher:
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(record))
    # 20 ms a token keeps each request in its slot for ~0.3 s, many busy-gauge samples long, so
    # a loaded CI host cannot finish a whole pass between two samples (a flaky F1 miss).
    knobs = {"token_delay_s": 0.02, **json.loads(env.pop("FAKE_ENGINE_KNOBS", "{}"))}
    monkeypatch.setenv("FAKE_ENGINE_KNOBS", json.dumps(knobs))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    exe = stand_in(tmp_path, "python")
    return EngineLauncher(
        engine_for(engine), exe, Path("/models/fake"), tmp_path / "logs",
        port_policy=ports.make_policy(None, None), env=dict(os.environ), ready_timeout=30.0,
    )  # fmt: skip


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_green_on_a_batch_invariant_fake_with_its_witness(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lau = launcher(tmp_path, engine, monkeypatch, VLLM_BATCH_INVARIANT="1")
    run = run_cell(plan(gate_passes=4), lau, ExactMatchScorer())
    verdict = decide(run.evidence, POLICY)
    assert verdict.status == "green", verdict.decision_reasons
    assert run.source == "live"
    assert all(p.busy_source == f"{engine}-metrics" for p in run.evidence.c_passes)
    assert all((p.server_busy_max or 0) >= 2 for p in run.evidence.c_passes)
    started = [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]
    assert len(started) == 2  # A on one sequence, then B/C on N
    bc = run.servers[1]
    assert bc.info["engine"] == engine and bc.info["cache_evidence"]["hits_seen"] is False
    if engine == "vllm":
        assert started[1]["env"]["VLLM_BATCH_INVARIANT"] == "1"
        assert bc.info["batch_invariant_mode"] is True
        assert "--max-num-seqs" in bc.argv and bc.argv[bc.argv.index("--max-num-seqs") + 1] == "4"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_unverified_when_the_engine_exports_no_busy_gauge(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lau = launcher(tmp_path, engine, monkeypatch, FAKE_ENGINE_WITNESS="0")
    run = run_cell(plan(gate_passes=2), lau, ExactMatchScorer())
    verdict = decide(run.evidence, POLICY)
    assert verdict.status == "green_unverified"
    assert all(p.server_busy_max is None and p.busy_source == "none" for p in run.evidence.c_passes)
    assert any("no server signal" in r for r in verdict.decision_reasons), verdict.decision_reasons


def test_red_on_a_fake_that_diverges_when_cobatched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    knobs = json.dumps({"cobatch_divergence": True})
    lau = launcher(tmp_path, "vllm", monkeypatch, FAKE_ENGINE_KNOBS=knobs)
    verdict = decide(run_cell(plan(gate_passes=2), lau, ExactMatchScorer()).evidence, POLICY)
    assert verdict.status == "failed" and verdict.divergence_class == "co_batching"


def test_a_fake_that_exits_is_an_infra_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = EngineLauncher(
        engine_for("llama-cpp-python"), stand_in(tmp_path, "python"), Path("/m"),
        tmp_path / "logs", port_policy=ports.make_policy(None, None), ready_timeout=10.0,
    )  # fmt: skip
    # The stand-in knows only vLLM's and SGLang's command lines: it refuses and exits.
    with pytest.raises(InfraError, match="exited with code"), bad.launch(ServerRole.A, 1, 512):
        pass


# ----- attach mode -------------------------------------------------------------------------


def attached_cell(knobs: MockKnobs, tmp_path: Path, engine: str = "llama-server") -> tuple:  # type: ignore[type-arg]
    with MockServer(parallel=4, ctx=512, knobs=knobs) as server:
        lau = AttachLauncher(attach_target(server.base_url), engine_for(engine))
        run = run_cell(plan(gate_passes=3), lau, ExactMatchScorer())
    spec = CellSpec(model="attached", ctx=512, dispatch_n=4, kv_label=run.kv_label, reps=1)
    done = finish_cell(run, spec, POLICY, Provenance(engine=engine), tmp_path)
    return run, done


def test_attached_red_is_real_evidence_but_never_promotable(tmp_path: Path) -> None:
    run, done = attached_cell(MockKnobs(cobatch_divergence=True), tmp_path)
    assert run.source == "attached" and run.launches == 2
    assert done.cert.source == "attached" and done.cert.verdict == "RED"
    assert not is_promotable(done.cert)
    servers = json.loads(done.path.read_text())["provenance"]["servers"]
    assert servers[0]["info"]["arm_a"] == ARM_A_NOTE and servers[0]["argv"] == []


def test_attached_clean_run_is_not_promotable(tmp_path: Path) -> None:
    run, done = attached_cell(MockKnobs(), tmp_path)
    assert all((p.server_busy_max or 0) >= 2 for p in run.evidence.c_passes)
    assert done.cert.source == "attached" and not is_promotable(done.cert)


def test_attached_with_an_engine_without_witness_is_unverified(tmp_path: Path) -> None:
    _, done = attached_cell(MockKnobs(), tmp_path, engine="llama-cpp-python")
    assert done.cert.verdict == "UNVERIFIED"


def test_attach_to_a_vllm_fake_uses_its_gauge(tmp_path: Path) -> None:
    # 20 ms a token, as in ``launcher``: a loaded host must not finish a pass between two
    # samples of the gauge (CI once saw green_unverified here).
    with fake_engine("vllm", parallel=4, ctx=512, knobs=MockKnobs(token_delay_s=0.02)) as server:
        lau = AttachLauncher(attach_target(server.base_url), engine_for("vllm"))
        run = run_cell(plan(gate_passes=4), lau, ExactMatchScorer())
    assert {p.busy_source for p in run.evidence.c_passes} == {"vllm-metrics"}
    assert decide(run.evidence, POLICY).status == "green"
    assert len(run.evidence.a) == len(ITEMS)


@pytest.mark.parametrize(
    ("url", "allow", "needle"),
    [
        ("http://10.0.0.5:8080", False, "not a loopback address; pass --allow-remote"),
        ("ftp://127.0.0.1:1", False, "is not an http(s) URL"),
        ("127.0.0.1:8080", False, "is not an http(s) URL"),
    ],
)
def test_attach_urls_are_checked(url: str, allow: bool, needle: str) -> None:
    with pytest.raises(UsageError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        attach_target(url, allow_remote=allow)


def test_remote_allowed_and_recorded() -> None:
    target = attach_target("http://10.0.0.5:8080/", "http://10.0.0.5:9090/metrics", True)
    assert target.base_url == "http://10.0.0.5:8080"
    assert target.to_record()["allow_remote"] is True
    assert attach_target("http://localhost:1").allow_remote is False
    assert attach_target("http://[::1]:1").base_url == "http://[::1]:1"
    with pytest.raises(UsageError, match="--metrics-url"):
        attach_target("http://127.0.0.1:1", "http://example.invalid/metrics")


def test_attach_to_nothing_is_an_infra_error() -> None:
    port = ports.pick_free(frozenset())
    lau = AttachLauncher(attach_target(f"http://127.0.0.1:{port}"), engine_for("llama-server"))
    with (
        pytest.raises(InfraError, match="is the server at --base-url running"),
        lau.launch(ServerRole.A, 1, 1),
    ):
        pass


# ----- vLLM's iteration-tokens histogram: corroboration, never the F1 witness ------------


def _attached_vllm_cell(witness: bool, histogram: bool = True) -> tuple[CellRun, list[ArmStats]]:
    # 20 ms a token: each request stays in its slot many gauge samples long (see launcher()).
    knobs = MockKnobs(token_delay_s=0.02)
    with fake_engine("vllm", 4, 512, knobs, witness=witness, histogram=histogram) as srv:
        lau = AttachLauncher(attach_target(srv.base_url), engine_for("vllm"))
        run = run_cell(plan(gate_passes=4), lau, ExactMatchScorer())
    passes = [s for s in run.arm_stats if s.arm == "C"]
    return run, passes


def test_the_histogram_delta_of_every_pass_is_recorded_next_to_its_gauge() -> None:
    run, passes = _attached_vllm_cell(witness=True)
    assert decide(run.evidence, POLICY).status == "green"
    for stats in passes:
        assert stats.counter_deltas is not None
        delta = stats.counter_deltas["vllm-iteration-tokens"]
        # 8 items x 4 steps each in the fake, most of them co-batched (steps over 1 token).
        assert delta["steps"] == 8 * 4 and delta["steps_over_1_token"] > 0
        assert "vllm-iteration-tokens" in stats.to_record()["witness_corroboration"]


def test_a_histogram_without_the_busy_gauge_never_meets_f1() -> None:
    run, passes = _attached_vllm_cell(witness=False)
    verdict = decide(run.evidence, POLICY)
    # The histogram says steps were co-batched, but F1 reads only the busy gauge: fail closed.
    deltas = [s.counter_deltas for s in passes]
    assert all(
        d is not None and d["vllm-iteration-tokens"]["steps_over_1_token"] > 0 for d in deltas
    )
    assert verdict.status == "green_unverified"
    assert any("no server signal" in r for r in verdict.decision_reasons)


def test_no_histogram_no_corroboration_and_the_gauge_still_decides() -> None:
    run, passes = _attached_vllm_cell(witness=True, histogram=False)
    assert decide(run.evidence, POLICY).status == "green"
    assert all(s.counter_deltas is None for s in passes)
    assert all("witness_corroboration" not in s.to_record() for s in passes)
