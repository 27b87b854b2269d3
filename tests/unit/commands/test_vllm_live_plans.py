"""The vLLM live cells (``tests/live/test_vllm_live.py``, which needs a provisioned vLLM this
host may not have) as the CLI prepares them: their plans pass the refusal a real run applies
before any launch, and ``--endpoint`` decides for a vLLM model as the docs say (a Hugging Face
folder has no GGUF header: ``auto`` means chat there). The cells' sizes and gates are imported
from the live test, so a change there that the refusal would stop fails here first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_invariance.cli import build_parser
from batch_invariance.commands.cell_options import refuse_unreachable, request_from_args
from batch_invariance.errors import PlanUnreachable
from batch_invariance.service.live import LiveCell, prepare
from tests.live.test_vllm_live import CTX, PARALLEL, PROMPTS, SMALL_CELL_GATES, TOKENS
from tests.support.fakes_live import hf_model_files
from tests.support.paths import WORKSETS
from tests.unit.engines.test_engine_cells import stand_in


def _workset(tmp_path: Path, name: str) -> Path:
    rows = json.loads((WORKSETS / name).read_text())[:PROMPTS]
    path = tmp_path / name
    path.write_text(json.dumps([{"id": r["id"], "prompt": r["prompt"]} for r in rows]))
    return path


def _job(tmp_path: Path, workset: Path, endpoint: str, *target: str) -> LiveCell:
    args = build_parser().parse_args([
        "run-live", "--engine", "vllm", "--workset", str(workset),
        "--out-dir", str(tmp_path / "out"), "--ctx", str(CTX), "--parallel", str(PARALLEL),
        "--gate-passes", "1", "--reps", "1", "--n-predict", str(TOKENS),
        "--endpoint", endpoint, "--no-serial-repeat", *SMALL_CELL_GATES, *target,
    ])  # fmt: skip
    return prepare(request_from_args(args), create_out_dir=False)


def _launched(tmp_path: Path) -> tuple[str, ...]:
    exe = stand_in(tmp_path, "vllm")
    model = hf_model_files(tmp_path / "model")
    return ("--server-bin", str(exe), "--model", str(model.parent))


def test_the_launched_completions_cell_is_not_refused(tmp_path: Path) -> None:
    job = _job(tmp_path, _workset(tmp_path, "cache_conversations.json"), "completions",
               *_launched(tmp_path), "--cache-arm")  # fmt: skip
    refuse_unreachable(job)  # raises where a real run would stop before the launch
    assert job.measurement.endpoint == "completions"


def test_the_attached_chat_cell_is_not_refused(tmp_path: Path) -> None:
    job = _job(tmp_path, _workset(tmp_path, "demo_completions.json"), "chat",
               "--base-url", "http://127.0.0.1:9")  # fmt: skip
    refuse_unreachable(job)
    assert job.measurement.endpoint == "chat"


def test_auto_on_a_vllm_model_folder_means_chat_and_says_why(tmp_path: Path) -> None:
    job = _job(tmp_path, _workset(tmp_path, "demo_completions.json"), "auto",
               *_launched(tmp_path))  # fmt: skip
    assert job.endpoint is not None and job.endpoint.endpoint == "chat"
    assert job.measurement.endpoint == "chat"
    assert job.endpoint.why is not None and "no GGUF header" in job.endpoint.why


def test_fewer_prompts_than_the_live_gates_need_are_refused(tmp_path: Path) -> None:
    rows = json.loads(_workset(tmp_path, "demo_completions.json").read_text())[:4]
    small = tmp_path / "four.json"
    small.write_text(json.dumps(rows))
    job = _job(tmp_path, small, "completions", *_launched(tmp_path))
    with pytest.raises(PlanUnreachable, match="too few distinct prompts: 4"):
        refuse_unreachable(job)
