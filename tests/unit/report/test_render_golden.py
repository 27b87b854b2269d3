"""Golden tests for every human view in :mod:`batch_invariance.report.render`.

Each view of a fixed GREEN and a fixed RED cert is compared byte for byte with
``tests/golden/<name>``. After an intended change to a view, regenerate with
``BATCH_INVARIANCE_REGEN_GOLDEN=1 python -m pytest tests/unit/report/test_render_golden.py``
and review the diff of ``tests/golden/`` like code.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance.cert.build import evidence_from_cert
from batch_invariance.cert.certificate import Cert, is_promotable
from batch_invariance.cert.verify import Depth, verify
from batch_invariance.core.chat_template import ChatTemplateCheck, fallback_warning
from batch_invariance.core.evidence import CellEvidence
from batch_invariance.core.plan import Measurement
from batch_invariance.core.verdict import decide
from batch_invariance.mock import MockKnobs, MockLauncher
from batch_invariance.report import render
from batch_invariance.report.render import sweep_text
from batch_invariance.run.cell import run_cell
from batch_invariance.run.progress import Progress
from batch_invariance.scorer_api import ExactMatchScorer
from batch_invariance.service.finish import FinishedCell
from batch_invariance.service.options import LaunchOptions
from batch_invariance.service.sweep_summary import SweepCell, sweep_summary
from tests.support.factories import cert_for, changed, green_evidence, replace_pass, replace_trial
from tests.support.golden import check_golden
from tests.unit.run.test_cell import plan as driver_plan

CERT_PATH = Path("/certs/tiny-model__ctx2048__N4.json")
OLD_PATH = Path("/certs/tiny-model__ctx2048__N4.superseded-1.json")


#: The spec's slot: the factory's sequences climb to 9/10 of it (the sequence scope).
SLOT = 2048


def _green() -> Cert:
    return cert_for(green_evidence(slot_ctx=SLOT))[0]


def _short() -> Cert:
    """Every gate met but the sequence length: 92-token sequences in a 2048-token slot."""
    return cert_for(replace(green_evidence(), slot_ctx=SLOT))[0]


def _red_evidence() -> CellEvidence:
    ev = green_evidence(slot_ctx=SLOT)
    trial = ev.c_passes[1].trials["t003"]
    return replace_trial(
        ev,
        "C",
        "t003",
        changed(trial, completion="a different | `answer`", extracted_answer="different"),
        pass_index=1,
    )


def _red() -> Cert:
    return cert_for(_red_evidence())[0]


def _unverified() -> Cert:
    """Overlap NOT met in pass 0 (the server saw one busy slot), so GREEN is not earned."""
    return cert_for(replace_pass(green_evidence(slot_ctx=SLOT), 0, server_busy_max=1))[0]


def _mock() -> Cert:
    return cert_for(source="mock")[0]


def _outputs(cert: Cert, bundle: str = "") -> dict[str, str]:
    return {
        "status": cert.status,
        "verdict": "GREEN" if cert.status == "green" else "RED",
        "promotable": "true" if is_promotable(cert) else "false",
        "cert-path": "certs/tiny-model__ctx2048__N4.json",
        "bundle-path": bundle,
        "divergent-ids": str(len(cert.divergence_report.ac.divergent_ids)),
        "cell": f"{cert.model}/{cert.ctx}/{cert.dispatch_n}",
        "cell-id": "tiny-model__ctx2048__N4",
    }


def test_the_fixtures_are_what_they_say() -> None:
    assert _green().status == "green" and is_promotable(_green())
    assert _red().status == "failed"
    assert _unverified().status == "green_unverified" and not _unverified().overlap.ok
    assert _short().status == "green_unverified" and not _short().gates["sequence_length"].ok


@pytest.mark.parametrize("kind", ["green", "red", "unverified", "short"])
def test_live_banner(kind: str) -> None:
    cert = {"green": _green, "red": _red, "unverified": _unverified, "short": _short}[kind]()
    superseded = OLD_PATH if kind == "red" else None
    check_golden(
        f"banner_{kind}.txt", render.live_banner(cert, CERT_PATH, superseded, "live cell x")
    )


def test_live_banner_warns_about_a_fallback_chat_template() -> None:
    """A base model on the chat endpoint: the banner says so and names the fixes."""
    block = ChatTemplateCheck("server_fallback", fallback_warning("llama-server")).to_record()
    cert = cert_for(_red_evidence(), extra_provenance={"chat_template": block})[0]
    assert render.chat_template_warning(cert) == fallback_warning("llama-server")
    assert render.chat_template_warning(_red()) is None
    check_golden(
        "banner_chat_fallback.txt", render.live_banner(cert, CERT_PATH, None, "live cell x")
    )


def test_mock_report_and_its_footer() -> None:
    cert = _mock()
    text = render.mock_report(cert, CERT_PATH, None, model="mock", divergence_mode=False)
    ok, line = render.mock_prediction(cert.status, divergence_mode=False)
    missed, wrong = render.mock_prediction(cert.status, divergence_mode=True)
    assert ok and not missed
    check_golden("mock_report.txt", text + line + "\n" + wrong + "\n")


def test_verify_text_of_a_cert_that_records_no_slot() -> None:
    """A cert written before the sequence scope: it verifies as written and says so."""
    cert = cert_for()[0]
    report = verify(cert, Depth.PARSED, origin=str(CERT_PATH), path=CERT_PATH)
    assert not report.problems and report.promotable
    check_golden("verify_not_recorded.txt", render.verify_report_text(report, None))


@pytest.mark.parametrize("signature", [None, "verified (me@example.com, https://issuer)"])
def test_verify(signature: str | None) -> None:
    cert = _green()
    name = "verify_signed.txt" if signature else "verify_unsigned.txt"
    report = verify(cert, Depth.PARSED, origin=str(CERT_PATH), path=CERT_PATH)
    assert not report.problems, report.problems
    check_golden(name, render.verify_report_text(report, signature))


@pytest.mark.parametrize("kind", ["green", "red", "unverified", "mock"])
def test_job_summary(kind: str) -> None:
    cert = {"green": _green, "red": _red, "unverified": _unverified, "mock": _mock}[kind]()
    passed = kind == "green"
    bundle = "certs/tiny-model__ctx2048__N4.sigstore.json" if passed else ""
    check_golden(
        f"summary_{kind}.md", render.summary_markdown(cert, "green", passed, _outputs(cert, bundle))
    )


@pytest.mark.parametrize("kind", ["green", "red"])
def test_job_summary_under_require_cert(kind: str) -> None:
    """``require: cert`` (the gate workflow's cells): met whatever the verdict, and the summary
    says the job did not gate on it."""
    cert = {"green": _green, "red": _red}[kind]()
    text = render.summary_markdown(cert, "cert", True, _outputs(cert))
    verdict = "GREEN" if kind == "green" else "RED"
    assert f"this job does not gate on the verdict, {verdict}: the caller does" in text
    check_golden(f"summary_cert_{kind}.md", text)


def test_annotations() -> None:
    green, red, mock = _green(), _red(), _mock()
    lines = [
        render.verdict_annotation(_unverified(), "green", False, "tiny-model/2048/4"),
        render.verdict_annotation(green, "green", True, "tiny-model/2048/4"),
        render.verdict_annotation(red, "green", False, "tiny-model/2048/4"),
        render.verdict_annotation(mock, "promotable", False, "mock/2048/4"),
        render.verdict_annotation(green, "promotable", False, "tiny-model/2048/4"),
        render.verdict_annotation(green, "cert", True, "tiny-model/2048/4"),
        render.verdict_annotation(red, "cert", True, "tiny-model/2048/4"),
        render.verdict_annotation(mock, "cert", False, "mock/2048/4"),
        render.annotation("error", "t: a, b", "50% done\nnext"),
    ]
    check_golden("annotations.txt", "\n".join(lines) + "\n" + render.failure_summary("h", "x | y"))


def test_dry_run_plan(tmp_path: Path) -> None:
    """The --dry-run plan on a fixed host (memory and CPUs are inputs, not read here)."""
    from batch_invariance.host.memory import GIB, HostMemory
    from batch_invariance.service.dry_run import dry_run
    from batch_invariance.service.live import prepare
    from batch_invariance.service.request import LiveRequest
    from tests.support.fakes_live import dense_meta, fake_server, write_gguf

    ws = tmp_path / "ws.json"
    ws.write_text(json.dumps([{"id": f"p{i}", "prompt": f"say {i}"} for i in range(5)]))
    request = LiveRequest(
        out_dir=tmp_path / "out",
        server_bin=fake_server(tmp_path / "bin"),
        model=write_gguf(tmp_path / "tiny.gguf", dense_meta(), padding=64 << 20),
        workset=ws,
        ctx=512,
        parallel=4,
        server_flags=("-ngl", "0"),
        measurement=Measurement(gate_passes=3, reps=2),
        launch=LaunchOptions(max_footprint_gb=0.25),
    )
    host = HostMemory(mem_available_bytes=8 * GIB, mem_total_bytes=16 * GIB, vram_free_bytes=None)
    plan = dry_run(prepare(request, create_out_dir=False), host, cpus=2)
    assert plan.refusal is not None and "max-footprint-gb" in plan.refusal
    check_golden(
        "dry_run.txt",
        plan.text.replace(str(tmp_path.resolve()), "<tmp>").replace(str(tmp_path), "<tmp>"),
    )


def test_sweep_table_golden() -> None:
    """The table `sweep` prints: a promotable GREEN N, a RED N (so max_safe_parallel is 2)
    and an N the memory guard refused."""
    cells = []
    for n, cert in ((2, _green()), (4, _red())):
        evidence = evidence_from_cert(cert)
        finished = FinishedCell(cert, decide(evidence, cert.evidence.policy), CERT_PATH, None)
        cells.append(SweepCell(n, finished, verify(cert, Depth.PARSED, path=CERT_PATH), None))
    cells.append(SweepCell(8, None, None, "not run: projected 9.50 GiB > cap 8.00 GiB"))
    summary = sweep_summary("tiny-model", 2048, cells, launches=3)
    check_golden("sweep.txt", sweep_text(summary, Path("/certs/sweep.json")))


class _StepClock:
    """A clock that moves 2.5 s each time it is read: progress lines get stable durations."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 2.5
        return self.now


def _progress_log(env: dict[str, str]) -> str:
    """The log lines of one mock cell: the France prompt differs on any server with more
    than one slot (C, B, then A' runs), and each server answers the Japan prompt HTTP 500
    once (A retries it; the B/C server first meets it in a pass, which never retries)."""
    stream = io.StringIO()
    knobs = MockKnobs(slot_divergence_if_contains=("France",), fail_once_if_contains=("Japan",))
    progress = Progress(stream, enabled=False, clock=_StepClock(), env=env)
    run_cell(driver_plan(gate_passes=2), MockLauncher(knobs), ExactMatchScorer(), progress)
    return stream.getvalue()


def test_progress_log_lines_golden() -> None:
    """Without a TTY: one line per arm and per C pass (what ran, how long, what it found)."""
    check_golden("progress_log.txt", _progress_log({}))


def test_progress_github_groups_golden() -> None:
    """Inside GitHub Actions each arm's lines sit in a ::group:: ... ::endgroup::."""
    text = _progress_log({"GITHUB_ACTIONS": "true"})
    check_golden("progress_github.txt", text)
    assert text.count("::group::") == text.count("::endgroup::") == 4  # A, C, B, A'
