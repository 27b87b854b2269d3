"""Live cells on other engines: llama-cpp-python's server (the negative control) and attach
mode against a real llama-server that the test started itself (attached, not launched)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cache_dir import cache_root
from batch_invariance.cert.certificate import is_promotable
from batch_invariance.cert.provenance import Provenance
from batch_invariance.cert.verify import verify
from batch_invariance.cli import main
from batch_invariance.core.evidence import CellSpec, GatePolicy
from batch_invariance.core.plan import CellPlan, Measurement
from batch_invariance.core.roles import ServerRole
from batch_invariance.engines.registry import engine_for
from batch_invariance.provision.embedded import Layout, Provisioned
from batch_invariance.provision.pinned_venv import EngineVenv, ensure_llama_cpp_python
from batch_invariance.run.cell import run_cell
from batch_invariance.run.workset import expand_reps, load_workset
from batch_invariance.scorer_api import ExactMatchScorer
from batch_invariance.servers import ports
from batch_invariance.servers.attach import AttachLauncher, attach_target
from batch_invariance.servers.launch import EngineLauncher
from batch_invariance.service.finish import FinishedCell, finish_cell
from tests.support.fakes_live import LOOSE_GATES
from tests.support.paths import WORKSETS

DEMO_WORKSET = WORKSETS / "demo.json"
#: Completion openings for the base model: co-batching changes several of them per pass on the
#: raw completions endpoint (the chat endpoint shows it on only 1-2 of 16, not every pass).
COMPLETIONS_WORKSET = WORKSETS / "demo_completions.json"


@pytest.fixture(scope="session")
def llama_cpp_python() -> EngineVenv:
    """The provisioned llama-cpp-python venv (built from source when missing: long)."""
    return ensure_llama_cpp_python(Layout(cache_root()))


def _plan(
    ctx: int,
    parallel: int,
    passes: int,
    n_predict: int,
    rows: int | None,
    *,
    completions: bool = False,
) -> CellPlan:
    items = load_workset(COMPLETIONS_WORKSET if completions else DEMO_WORKSET).items
    return CellPlan(
        items=expand_reps(items[:rows] if rows else items, 1),
        ctx=ctx,
        parallel=parallel,
        measurement=Measurement(
            gate_passes=passes,
            n_predict=n_predict,
            serial_repeat=False,
            req_timeout=300.0,
            endpoint="completions" if completions else "chat",
        ),
    )


def _finish(run: object, plan: CellPlan, out: Path, engine: str) -> FinishedCell:
    from batch_invariance.run.records import CellRun

    assert isinstance(run, CellRun)
    spec = CellSpec(
        model="gemma-3-270m-q4_k_m", ctx=plan.ctx, dispatch_n=plan.parallel,
        kv_label=run.kv_label, reps=1,
    )  # fmt: skip
    return finish_cell(run, spec, GatePolicy(), Provenance(engine=engine), out)


def test_llama_cpp_python_is_never_green_without_a_cobatching_witness(
    live_pair: Provisioned,
    llama_cpp_python: EngineVenv,
    demo_subset: Callable[[int], Path],
    tmp_path: Path,
) -> None:
    """llama-cpp-python's server runs one request at a time and reports nothing a co-batching
    witness could read, so the overlap gate is never met and the cell is never GREEN.

    Under ``--endpoint auto`` this base model gets raw completions, and there the cell is
    RED as often as UNVERIFIED, and rightly: the server reuses the KV of the longest token
    prefix a request shares with the one before it (``llama_cpp.Llama.generate``, whatever
    ``cache_prompt`` says, with no flag to turn it off), so an answer depends on which request
    came before, and the concurrent arm's order is not the serial one. Measured here (8
    prompts x 3 reps, one C pass): 3 of 24 answers changed, logprobs drifted from the first
    token on 11, and the serial B arm, in another order, changed 1. On the chat endpoint (no
    longer run for a base model: the plan is refused) the same drift rarely flipped a token
    within 16 tokens, hence the old expectation of UNVERIFIED with nothing divergent."""
    out = tmp_path / "out"
    code = main([
        "run-live", "--engine", "llama-cpp-python", "--server-bin", str(llama_cpp_python.python),
        "--model", str(live_pair.model), "--workset", str(demo_subset(8)), "--ctx", "512",
        "--parallel", "2", "--gate-passes", "1", "--n-predict", "16", "--no-serial-repeat",
        "--req-timeout", "300", "--out-dir", str(out), *LOOSE_GATES,
    ])  # fmt: skip
    (path,) = out.glob("*.json")
    checked = verify(path)
    assert checked.problems == ()  # its identity reads --n_ctx and --model
    cert = checked.cert
    assert cert is not None
    assert code == exitcodes.for_status(str(cert.status), False)
    assert cert.source == "live" and cert.verdict in ("UNVERIFIED", "RED"), cert.decision_reasons
    plan = cert.provenance.plan
    assert plan is not None and plan.endpoint == "completions"  # auto: a base model
    assert not cert.overlap.ok and "no server signal" in cert.overlap.reason
    assert all(p.server_busy_max is None for p in cert.overlap.per_pass)
    if cert.verdict == "UNVERIFIED":
        assert cert.divergence_report.ac.n_divergent == 0
    assert cert.provenance.engine == "llama-cpp-python"
    assert "llama_cpp.server" in (cert.provenance.server_entries[1].argv or ())
    assert not checked.promotable


def test_attached_real_llama_server_at_default_flags_reaches_red(
    live_pair: Provisioned, tmp_path: Path
) -> None:
    plan = _plan(ctx=512, parallel=4, passes=2, n_predict=64, rows=12, completions=True)
    # Started by the test, not by the tool: the tool only gets its URL.
    external = EngineLauncher(
        engine_for("llama-server"), live_pair.server_bin, live_pair.model, tmp_path / "logs",
        port_policy=ports.make_policy(None, None),
    )  # fmt: skip
    with external.launch(ServerRole.BC, 4, 512) as server:
        launcher = AttachLauncher(attach_target(server.base_url), engine_for("llama-server"))
        run = run_cell(plan, launcher, ExactMatchScorer())
        assert server.process.pid is not None  # still ours, still running: never stopped
        server.check_alive()
    done = _finish(run, plan, tmp_path / "out", "llama-server")
    cert = done.cert
    assert cert.source == "attached"
    assert cert.verdict == "RED", cert.decision_reasons
    assert cert.overlap.ok and cert.divergence_report.ac.n_divergent >= 1
    assert not is_promotable(cert)
    assert run.servers[0].info["kind"] == "attached"


def test_attached_llama_cpp_python_is_unverified(
    live_pair: Provisioned, llama_cpp_python: EngineVenv, tmp_path: Path
) -> None:
    plan = _plan(ctx=512, parallel=2, passes=1, n_predict=16, rows=8)
    engine = engine_for("llama-cpp-python")
    external = EngineLauncher(
        engine, llama_cpp_python.python, live_pair.model, tmp_path / "logs",
        port_policy=ports.make_policy(None, None), ready_timeout=180.0,
    )  # fmt: skip
    with external.launch(ServerRole.BC, 2, 512) as server:
        launcher = AttachLauncher(attach_target(server.base_url), engine)
        run = run_cell(plan, launcher, ExactMatchScorer())
    cert = _finish(run, plan, tmp_path / "out", "llama-cpp-python").cert
    assert cert.source == "attached" and cert.verdict == "UNVERIFIED", cert.decision_reasons
    assert not cert.overlap.ok and cert.divergence_report.ac.n_divergent == 0
