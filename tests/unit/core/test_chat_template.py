"""Which chat template shaped a cell's chat requests, and the warning for a base model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_invariance.cert.certificate import cert_to_json
from batch_invariance.cert.provenance import ChatTemplateRecord, Provenance
from batch_invariance.cert.verify import verify
from batch_invariance.cli import main
from batch_invariance.core.chat_template import (
    ChatFallback,
    ChatTemplateCheck,
    fallback_warning,
    judge_chat_template,
    sends_chat,
)
from batch_invariance.core.evidence import CellSpec, GatePolicy
from batch_invariance.core.plan import Endpoint, Measurement, WorkItem
from batch_invariance.engines.llama_server.chat_template import LLAMA_CPP_CHATML_FALLBACK
from batch_invariance.mock import MockKnobs, MockLauncher, MockServer
from batch_invariance.run.cell import CellPlan, run_cell
from batch_invariance.run.records import ModelTemplate
from batch_invariance.run.workset import items_to_row
from batch_invariance.scorer_api import ExactMatchScorer
from batch_invariance.service.finish import finish_cell
from tests.support.factories import cert_for
from tests.support.fakes_live import LOOSE_GATES
from tests.support.paths import GOLDEN

ITEMS = (WorkItem("fr", "What is the capital of France?", None, expected_answer="Paris"),)
CHAT_ROW = WorkItem("m", None, (("user", "hi"),))


FALLBACK_WARNING = fallback_warning("llama-server")


def _judge(**kw: object) -> ChatTemplateCheck:
    args: dict[str, object] = {
        "uses_chat": True,
        "server_argv": (),
        "server_template": None,
        "fallback": ChatFallback("llama-server", LLAMA_CPP_CHATML_FALLBACK),
    }
    args.update(kw)
    return judge_chat_template(**args)  # type: ignore[arg-type]


def test_a_model_without_a_template_warns_and_names_both_fixes() -> None:
    check = _judge(model_read=True, model_template=None)
    assert check.source == "server_fallback" and check.warning == FALLBACK_WARNING
    assert "--endpoint completions" in FALLBACK_WARNING
    assert "--server-flag --chat-template NAME" in FALLBACK_WARNING
    assert FALLBACK_WARNING.startswith("the model has no chat template of its own: llama-server")
    # Without the model file, the server's own report of its ChatML fallback says the same.
    assert _judge(server_template=LLAMA_CPP_CHATML_FALLBACK).source == "server_fallback"


#: ``GET /props`` (trimmed to ``chat_template``) from the real llama-server 11434.0.0 serving
#: Gemma 3 270M, a model without a template of its own, as it came over the wire.
REAL_PROPS = GOLDEN / "real_props_gemma3_270m.json"


def test_the_fallback_text_is_what_the_real_server_reports() -> None:
    props = json.loads(REAL_PROPS.read_text(encoding="utf-8"))
    assert props["chat_template"] == LLAMA_CPP_CHATML_FALLBACK
    assert _judge(server_template=props["chat_template"]).warning == FALLBACK_WARNING


def test_no_warning_when_the_template_is_known_or_not_used() -> None:
    assert _judge(model_read=True, model_template="{{ x }}") == ChatTemplateCheck("model", None)
    assert _judge(server_template="{{ own }}").source == "model"
    assert _judge().source == "unknown" and _judge().warning is None
    for argv in (("--chat-template", "chatml"), ("--chat-template-file=t.jinja",)):
        check = _judge(server_argv=argv, model_read=True, model_template=None)
        assert check == ChatTemplateCheck("server_flag", None)
    not_used = _judge(uses_chat=False, model_read=True, model_template=None)
    assert not_used == ChatTemplateCheck("not_used", None)
    assert not sends_chat("completions", ITEMS) and sends_chat("completions", (CHAT_ROW,))
    assert sends_chat("chat", ITEMS)


def _plan(endpoint: Endpoint) -> CellPlan:
    return CellPlan(
        items=ITEMS,
        ctx=512,
        parallel=2,
        measurement=Measurement(
            gate_passes=2, n_predict=8, seed=1, req_timeout=10.0, endpoint=endpoint
        ),
    )


def test_the_mock_plays_a_base_model_and_the_cert_carries_the_warning(tmp_path: Path) -> None:
    run = run_cell(_plan("chat"), MockLauncher(MockKnobs(chat_template=None)), ExactMatchScorer())
    assert run.server_chat_template == LLAMA_CPP_CHATML_FALLBACK
    spec = CellSpec(model="mock", ctx=512, dispatch_n=2, kv_label=run.kv_label, reps=1)
    done = finish_cell(run, spec, GatePolicy(), Provenance(tool_version="test"), tmp_path)
    block = json.loads(done.path.read_text())["provenance"]["chat_template"]
    assert block == {"source": "server_fallback", "warning": FALLBACK_WARNING}
    # The default mock carries its own template; the completions endpoint uses none.
    own = run_cell(_plan("chat"), MockLauncher(MockKnobs()), ExactMatchScorer())
    assert own.provenance().chat_template == ChatTemplateRecord(source="model", warning=None)
    raw = run_cell(_plan("completions"), MockLauncher(MockKnobs()), ExactMatchScorer())
    raw_block = raw.provenance().chat_template
    assert raw_block is not None and raw_block.source == "not_used"


def test_a_cert_with_the_warning_still_re_derives() -> None:
    block = ChatTemplateCheck("server_fallback", FALLBACK_WARNING).to_record()
    cert, verdict = cert_for(extra_provenance={"chat_template": block})
    report = verify(json.dumps(cert_to_json(cert)))
    assert report.problems == () and report.status == verdict.status == "green"


def test_attach_mode_cert_carries_the_fallback_warning_from_props(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run-live --base-url`` at a base model's server: /props reports the ChatML fallback,
    and the cert says so (the block has one writer, so no second one can say ``unknown``)."""
    workset = tmp_path / "ws.json"
    # Three distinct prompts: the least the loose gates' bound can reach GREEN with, so the
    # plan refusal lets the run go on.
    rows = [WorkItem(f"q{i}", f"Question {i}: what is {i} + {i}?", None) for i in range(3)]
    workset.write_text(json.dumps([items_to_row(i) for i in rows]))
    out = tmp_path / "out"
    with MockServer(parallel=2, ctx=512, knobs=MockKnobs(chat_template=None)) as server:
        code = main([
            "run-live", "--base-url", server.base_url, "--workset", str(workset),
            "--ctx", "512", "--parallel", "2", "--gate-passes", "2", "--n-predict", "8",
            "--endpoint", "chat", "--out-dir", str(out), *LOOSE_GATES,
        ])  # fmt: skip
    banner = capsys.readouterr().out
    (cert_path,) = out.glob("*.json")
    cert = json.loads(cert_path.read_text())
    assert code == 3 and cert["source"] == "attached", banner
    assert cert["provenance"]["chat_template"] == {
        "source": "server_fallback",
        "warning": FALLBACK_WARNING,
    }
    assert FALLBACK_WARNING.split(";")[0] in banner


def test_the_model_file_decides_over_the_servers_report() -> None:
    """A launched GGUF's header is read: its template (or its lack of one) decides, whatever
    ``/props`` said; the block is written once, from both."""
    run = run_cell(_plan("chat"), MockLauncher(MockKnobs()), ExactMatchScorer())
    without = run.provenance(ModelTemplate(None)).chat_template
    assert without == ChatTemplateRecord(source="server_fallback", warning=FALLBACK_WARNING)
    own = run.provenance(ModelTemplate("{{ messages }}")).chat_template
    assert own == ChatTemplateRecord(source="model", warning=None)
