"""``require: cert``: the job passes when the run wrote a live cert, whatever its verdict (the
gate workflow's measure job: its gate job says the verdict). A mock cert, a signing failure,
a run without a cert and a baseline's ``fail-on`` still fail the job.

The live cells run the Action end to end on the launched protocol fake (the vLLM stand-in of
the engine tests), whose knobs give each verdict.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.action import entrypoint as action
from batch_invariance.action.inputs import read_inputs
from batch_invariance.action.outputs import require_holds
from batch_invariance.errors import InfraError, UsageError
from tests.support.factories import cert_for
from tests.support.fakes_live import hf_model_files
from tests.unit.action.test_baseline import _with_changed_answer
from tests.unit.action.test_entrypoint import (
    BrokenSigner,
    actions_env,
    fake_github_jwt,
    outputs_of,
    run_signed,
    summary_of,
    tiny_workset,
)
from tests.unit.engines.test_engine_cells import stand_in

#: The verdict each setting of the stand-in gives: its knobs and whether it exports the busy
#: gauge F1 needs (without it, GREEN is not earned).
VERDICTS = {
    "GREEN": ({}, "1"),
    "RED": ({"cobatch_divergence": True}, "1"),
    "AMBER": ({"token_divergence": True}, "1"),
    "UNVERIFIED": ({}, "0"),
}


def _live_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verdict: str) -> dict[str, str]:
    """A live cell of the vLLM stand-in that comes out ``verdict`` (unsigned, require cert)."""
    knobs, witness = VERDICTS[verdict]
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    # The ladder's prompts evaluated at a tenth of the mock's default per-token time.
    monkeypatch.setenv("FAKE_ENGINE_KNOBS", json.dumps({"prompt_token_delay_s": 0.0001, **knobs}))
    monkeypatch.setenv("FAKE_ENGINE_WITNESS", witness)
    env = actions_env(tmp_path, mode="live", engine="vllm", model="model.safetensors",
                      ctx="512", parallel="4", reps="1", sign="false", require="cert",
                      **{"server-bin": "vllm", "gate-passes": "2", "n-predict": "96"})  # fmt: skip
    ws = Path(env["GITHUB_WORKSPACE"])
    stand_in(ws, "vllm")
    hf_model_files(ws)
    return env


def _run(env: dict[str, str], **inputs: str) -> tuple[int, str]:
    for name, value in inputs.items():
        env[f"INPUT_{name.upper()}"] = value
    buf = io.StringIO()
    return action.run_action(env, out=buf), buf.getvalue()


@pytest.mark.parametrize("verdict", ["GREEN", "AMBER", "UNVERIFIED"])
def test_require_cert_passes_a_live_cert_whatever_its_verdict(
    verdict: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _live_env(tmp_path, monkeypatch, verdict)
    code, out = _run(env)
    assert outputs_of(env)["verdict"] == verdict, out
    assert code == exitcodes.PROMOTABLE, out
    said = f"require cert met (a cert was written; this job does not gate on the verdict, {verdict}"
    assert f"::notice title=batch-invariance {verdict}::" in out and said in out
    assert f"this job does not gate on the verdict, {verdict}: the caller does" in summary_of(env)


def test_require_cert_passes_a_red_cert_and_a_baseline_still_fails_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _live_env(tmp_path, monkeypatch, "RED")
    code, out = _run(env, **{"out-dir": "first"})
    outputs = outputs_of(env)
    assert outputs["verdict"] == "RED" and code == exitcodes.PROMOTABLE, out
    assert "::notice title=batch-invariance RED::" in out and "::error" not in out
    assert "does not gate on the verdict, RED: the caller does); promotable: false" in (
        summary_of(env)
    )
    # With a baseline, its fail-on still decides: one of the baseline's answers changed.
    ws = Path(env["GITHUB_WORKSPACE"])
    _with_changed_answer(ws / outputs["cert-path"], ws / "changed")
    code, out = _run(env, **{"out-dir": "second", "baseline": "changed",
                             "baseline-allow-unsigned": "true"})  # fmt: skip
    assert code == exitcodes.RED, out
    assert "::notice title=batch-invariance RED::" in out  # not the verdict: the baseline
    assert "::error title=batch-invariance against the baseline::fail-on scored:" in out


def test_require_cert_still_fails_on_a_signing_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _live_env(tmp_path, monkeypatch, "GREEN")
    code, printed = run_signed(env, BrokenSigner(), fake_github_jwt())
    assert code == exitcodes.INFRA, printed
    assert "::error title=batch-invariance signing failed" in printed


def test_require_cert_never_passes_a_mock_cert(tmp_path: Path) -> None:
    env = actions_env(tmp_path, mode="mock", sign="false", require="cert")
    env["INPUT_WORKSET"] = tiny_workset(env)
    code, out = _run(env)
    assert code != exitcodes.PROMOTABLE and outputs_of(env)["cert-path"], out
    assert "::notice" not in out and "require cert" in out
    assert "NOT met" in summary_of(env)


def test_require_cert_fails_a_run_that_wrote_no_cert(tmp_path: Path) -> None:
    def provision_fails() -> tuple[Path, Path]:
        raise InfraError("llama-server build failed; see build.log")

    env = actions_env(tmp_path, sign="false", require="cert")
    buf = io.StringIO()
    assert action.run_action(env, out=buf, provisioner=provision_fails) == exitcodes.INFRA
    assert "cert-path" not in outputs_of(env)


def test_require_cert_holds_on_every_live_verdict_and_never_on_a_mock(tmp_path: Path) -> None:
    got = read_inputs({"GITHUB_WORKSPACE": str(tmp_path), "INPUT_REQUIRE": " Cert "})
    assert got.require == "cert" and not got.baseline.source  # no baseline needed
    green, mock = cert_for()[0], cert_for(source="mock")[0]
    assert require_holds(green, "cert") and not require_holds(mock, "cert")
    with pytest.raises(UsageError, match="must be green, promotable, cert or none, got 'amber'"):
        read_inputs({"GITHUB_WORKSPACE": str(tmp_path), "INPUT_REQUIRE": "amber"})
