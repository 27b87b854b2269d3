"""The Action's plan step: it says what the cell measures (the length ladder by default) and
refuses, before any server starts, a plan whose ``require`` can never hold."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.action import entrypoint as action
from tests.support.fakes_live import dense_meta, fake_server, write_gguf
from tests.unit.action.test_entrypoint import actions_env, outputs_of

REFUSED = "::error title=batch-invariance refused to launch (no verdict)::"


def _no_provision() -> tuple[Path, Path]:
    raise AssertionError("server-bin and model are given: nothing to provision")


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    marker = tmp_path / "launched"
    monkeypatch.setenv("FAKE_SERVER_MARKER", str(marker))
    made = actions_env(tmp_path, sign="false", **{"server-bin": "bin/llama-server"},
                       model="base.gguf")  # fmt: skip
    workspace = Path(made["GITHUB_WORKSPACE"])
    fake_server(workspace / "bin")
    write_gguf(workspace / "base.gguf", dense_meta(), padding=1 << 20)
    (workspace / "few.json").write_text(
        json.dumps([{"id": f"p{i}", "prompt": f"Tell me about {i}."} for i in range(5)])
    )
    return {**made, "FAKE_SERVER_MARKER": str(marker)}


def _run(env: dict[str, str], **inputs: str) -> tuple[int, str]:
    for name, value in inputs.items():
        env[f"INPUT_{name.upper()}"] = value
    buf = io.StringIO()
    code = action.run_action(env, out=buf, provisioner=_no_provision)
    assert not Path(env["FAKE_SERVER_MARKER"]).exists(), "a server was launched"
    return code, buf.getvalue()


@pytest.mark.parametrize(
    ("inputs", "cause"),
    [
        ({"workset": "few.json", "n-predict": "900"}, "too few distinct prompts: 5"),
        ({"n-predict": "16"}, "answer budget under the length gate: --n-predict 16"),
        ({"endpoint": "chat"}, "a base model on the chat endpoint"),
    ],
)
def test_a_plan_that_cannot_pass_is_refused_before_any_launch(
    env: dict[str, str], inputs: dict[str, str], cause: str
) -> None:
    code, text = _run(env, **inputs)
    assert code == exitcodes.USAGE
    assert f"{REFUSED}require: green can never hold, this plan cannot reach GREEN: {cause}" in text
    # No verdict; the refused plan, with its cause, goes to the failure's artifact.
    outputs = outputs_of(env)
    assert set(outputs) == {"cell-id", "debug-paths"}
    plan = Path(env["GITHUB_WORKSPACE"]) / outputs["debug-paths"]
    assert f"this plan cannot reach GREEN: {cause}" in plan.read_text()


def test_require_promotable_is_refused_too(env: dict[str, str]) -> None:
    code, text = _run(env, require="promotable", **{"n-predict": "16"})
    assert code == exitcodes.USAGE and "require: promotable can never hold" in text


def test_require_cert_is_refused_too(env: dict[str, str]) -> None:
    """Under cert the job would pass on any verdict, but the gate on the cert never could."""
    code, text = _run(env, require="cert", **{"n-predict": "16"})
    assert code == exitcodes.USAGE
    assert f"{REFUSED}require: cert: a gate on this cert can never pass, this plan cannot" in text


def test_the_default_plan_reports_the_ladder(env: dict[str, str]) -> None:
    # The ladder, on completions (auto: the model has no chat template), reaches the run; the
    # fake server then fails to start, which is an infrastructure failure, not a refusal.
    env["INPUT_READY-TIMEOUT"] = "1"
    buf = io.StringIO()
    code = action.run_action(env, out=buf, provisioner=_no_provision)
    text = buf.getvalue()
    assert "batch-invariance: plan: work-set: length ladder, 32 distinct prompts" in text
    assert REFUSED not in text and "cannot reach GREEN" not in text, text
    assert code != exitcodes.USAGE, text
