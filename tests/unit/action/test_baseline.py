"""The Action's ``baseline:``: inputs, the latest release's certs fetched from a loopback fake
of the GitHub REST API (the real API is not exercised here), and the job: an identical
baseline passes, a changed answer fails it, the summary shows the table.

The cells run on a launched protocol fake (the vLLM stand-in of the engine tests), which is
batch-invariant and deterministic, so its GREEN is earned and two runs give identical arms A.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest

from batch_invariance import exitcodes
from batch_invariance.action.baseline import (
    BaselineInputs,
    fetch_release_certs,
    read_baseline_inputs,
)
from batch_invariance.action.entrypoint import run_action
from batch_invariance.action.inputs import INPUT_DEFAULTS
from batch_invariance.cert.build import build_cert, evidence_from_cert, spec_from_cert
from batch_invariance.cert.parse import parse_cert
from batch_invariance.cert.store import render
from batch_invariance.core.verdict import decide
from batch_invariance.errors import UsageError
from tests.support.factories import changed_answer
from tests.support.fakes_live import hf_model_files
from tests.support.loopback import serving
from tests.unit.engines.test_engine_cells import stand_in

TOKEN = "ghs_fake_token"


def _raw(**given: str) -> dict[str, str]:
    return {**INPUT_DEFAULTS, **given}


def test_baseline_inputs() -> None:
    env = {"GITHUB_REPOSITORY": "o/r"}
    assert read_baseline_inputs(_raw(), env) == BaselineInputs("", "scored", None)
    unsigned = read_baseline_inputs(
        _raw(baseline="c.json", **{"baseline-allow-unsigned": "true"}), env
    )
    assert unsigned == BaselineInputs("c.json", "scored", None)
    signed = read_baseline_inputs(
        _raw(
            baseline="release:latest", **{"baseline-identity": "https://x/.+", "fail-on": "drift"}
        ),
        env,
    )
    assert signed.fail_on == "drift" and signed.signing is not None
    assert signed.signing.signer.repository == "o/r" and signed.signing.signer.identity_is_regexp
    with pytest.raises(UsageError, match="baseline needs baseline-identity"):
        read_baseline_inputs(_raw(baseline="c.json"), env)
    with pytest.raises(UsageError, match="input fail-on must be one of"):
        read_baseline_inputs(_raw(**{"fail-on": "answers"}), env)
    with pytest.raises(UsageError, match="skips the baseline's signature"):
        read_baseline_inputs(
            _raw(
                baseline="c.json", **{"baseline-allow-unsigned": "true", "baseline-identity": "x"}
            ),
            env,
        )


class _FakeGitHub(BaseHTTPRequestHandler):
    """``GET /repos/{repo}/releases/latest`` and its assets, as the REST API answers them."""

    release: ClassVar[dict[str, Any] | None] = None
    assets: ClassVar[dict[str, bytes]] = {}
    seen: ClassVar[list[tuple[str, str, str]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        auth = self.headers.get("Authorization", "")
        self.seen.append((self.path, self.headers.get("Accept", ""), auth))
        if auth != f"Bearer {TOKEN}":
            self._send(401, b'{"message": "Bad credentials"}')
        elif self.path in ("/repos/o/r/releases/latest", "/repos/o/r/releases/tags/v1.0.0"):
            if self.release is None:
                self._send(404, b'{"message": "Not Found"}')
            else:
                self._send(200, json.dumps(self.release).encode())
        elif self.path.startswith("/repos/o/r/releases/assets/"):
            name = self.path.rsplit("/", 1)[1]
            if self.headers.get("Accept") != "application/octet-stream":
                self._send(200, b'{"asset": "metadata, not the bytes"}')
            else:
                self._send(200, self.assets[name], "application/octet-stream")
        else:
            self._send(404, b"{}")


@pytest.fixture()
def github() -> Iterator[tuple[str, type[_FakeGitHub]]]:
    handler = type("Handler", (_FakeGitHub,), {"release": None, "assets": {}, "seen": []})
    with serving(handler) as base:
        yield base, handler


def _publish(handler: type[_FakeGitHub], base: str, files: dict[str, bytes]) -> None:
    handler.assets = dict(files)
    handler.release = {
        "tag_name": "v1.0.0",
        "assets": [
            {"name": name, "url": f"{base}/repos/o/r/releases/assets/{name}",
             "browser_download_url": f"https://github.invalid/{name}"}
            for name in files
        ],
    }  # fmt: skip


def _env(base: str) -> dict[str, str]:
    return {"GITHUB_API_URL": base, "GITHUB_REPOSITORY": "o/r", "GITHUB_TOKEN": TOKEN}


def test_release_certs_are_fetched_with_the_token(
    github: tuple[str, type[_FakeGitHub]], tmp_path: Path
) -> None:
    base, handler = github
    _publish(handler, base, {"m__ctx512__N4.json": b"{cert}", "m__ctx512__N4.json.sigstore.json":
                             b"{bundle}", "notes.txt": b"x", "sweep.json": b"{}"})  # fmt: skip
    got = fetch_release_certs(_env(base), tmp_path / "b")
    assert fetch_release_certs(_env(base), tmp_path / "t", tag="v1.0.0").is_dir()
    assert sorted(p.name for p in got.iterdir()) == [
        "m__ctx512__N4.json",
        "m__ctx512__N4.json.sigstore.json",
    ]
    assert (got / "m__ctx512__N4.json").read_bytes() == b"{cert}"
    assert all(auth == f"Bearer {TOKEN}" for _, _, auth in handler.seen)
    assert handler.seen[1][1] == "application/octet-stream"


def test_no_release_or_no_cert_is_a_usage_error(
    github: tuple[str, type[_FakeGitHub]], tmp_path: Path
) -> None:
    base, handler = github
    with pytest.raises(UsageError, match="has no such published release"):
        fetch_release_certs(_env(base), tmp_path / "b")
    with pytest.raises(UsageError, match=r"baseline release:v0\.9: o/r has no such published"):
        fetch_release_certs(_env(base), tmp_path / "b", tag="v0.9")
    _publish(handler, base, {"notes.txt": b"x"})
    with pytest.raises(UsageError, match=r"release v1\.0\.0 of o/r has no cert attached"):
        fetch_release_certs(_env(base), tmp_path / "b")
    with pytest.raises(Exception, match="HTTP 401"):
        fetch_release_certs({**_env(base), "GITHUB_TOKEN": "wrong"}, tmp_path / "b")


# ------------------------------------------------------------------- the job, end to end


@pytest.fixture()
def cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    # The ladder's prompts evaluated at a tenth of the mock's default per-token time.
    monkeypatch.setenv("FAKE_ENGINE_KNOBS", json.dumps({"prompt_token_delay_s": 0.0001}))
    ws = tmp_path / "ws"
    ws.mkdir()
    # No work-set: the Action measures the length ladder of the 512-token slot.
    stand_in(ws, "vllm")
    hf_model_files(ws)
    return {
        "GITHUB_WORKSPACE": str(ws), "INPUT_MODE": "live", "INPUT_ENGINE": "vllm",
        "INPUT_SERVER-BIN": "vllm", "INPUT_MODEL": "model.safetensors",
        "INPUT_CTX": "512", "INPUT_PARALLEL": "4",
        "INPUT_GATE-PASSES": "2", "INPUT_REPS": "1", "INPUT_N-PREDICT": "64",
        "INPUT_SIGN": "false",
    }  # fmt: skip


def _job(env: dict[str, str], tmp_path: Path, name: str, **inputs: str) -> tuple[int, str, str]:
    summary, output = tmp_path / f"{name}.summary.md", tmp_path / f"{name}.output"
    full = {
        **env,
        "INPUT_OUT-DIR": name,
        "GITHUB_STEP_SUMMARY": str(summary),
        "GITHUB_OUTPUT": str(output),
        **{f"INPUT_{k.upper()}": v for k, v in inputs.items()},
    }
    import io

    stream = io.StringIO()
    code = run_action(full, out=stream)
    return code, summary.read_text() if summary.exists() else "", stream.getvalue()


def _with_changed_answer(cert_path: Path, out: Path) -> Path:
    """The same cell's cert rebuilt with one prompt of arm A answering otherwise: a valid cert
    (it re-derives from its own evidence) of what a build that changed one answer records."""
    cert = parse_cert(cert_path.read_text())
    ev = evidence_from_cert(cert)
    tid = sorted(ev.a)[0]
    a = dict(ev.a)
    a[tid] = changed_answer(a[tid])
    ev = replace(ev, a=a)
    policy = cert.evidence.policy
    rebuilt = build_cert(ev, decide(ev, policy), spec_from_cert(cert), policy, cert.provenance,
                         cert.source, cert.ts_utc)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    target = out / cert_path.name
    target.write_text(render(rebuilt))
    return target


def test_identical_baseline_passes_a_changed_answer_fails_and_the_summary_shows_the_table(
    cell: dict[str, str], tmp_path: Path, github: tuple[str, type[_FakeGitHub]]
) -> None:
    code, _, _ = _job(cell, tmp_path, "first")
    assert code == exitcodes.PROMOTABLE
    ws = Path(cell["GITHUB_WORKSPACE"])
    (first,) = (ws / "first").glob("*__N4.json")

    code, summary, out = _job(cell, tmp_path, "same", baseline=f"first/{first.name}",
                              **{"BASELINE-ALLOW-UNSIGNED": "true"})  # fmt: skip
    assert code == exitcodes.PROMOTABLE, out
    assert "### Against the baseline: pass (fail on `scored`)" in summary
    assert (
        "| cell | verdict | identical | drift | tokens changed | scored changed | worst |"
        in summary
    )
    assert "| GREEN → GREEN | 32 | 0 | 0 | 0 | identical |" in summary
    assert "::notice title=batch-invariance against the baseline::fail-on scored passes" in out
    outputs = (tmp_path / "same.output").read_text()
    assert "baseline-worst<<" in outputs and "\nidentical\n" in outputs
    assert (ws / "same" / (first.stem + ".compare.json")).is_file()

    bad = _with_changed_answer(first, ws / "changed-baseline")
    code, summary, out = _job(cell, tmp_path, "changed", baseline="changed-baseline",
                              **{"BASELINE-ALLOW-UNSIGNED": "true"})  # fmt: skip
    assert code == exitcodes.RED, out
    assert "### Against the baseline: FAIL (fail on `scored`)" in summary
    assert "| scored |" in summary and "something else" in summary
    assert "::error title=batch-invariance against the baseline::fail-on scored:" in out
    comparison = json.loads((ws / "changed" / (first.stem + ".compare.json")).read_text())
    assert comparison["worst"] == "scored" and comparison["policy"]["failed"] is True
    assert comparison["baseline"] == str(bad.parent)

    # The latest release holds the first cert: fetched from the (fake) REST API, identical.
    base, handler = github
    _publish(handler, base, {first.name: first.read_bytes()})
    env = {**cell, **_env(base)}
    code, summary, out = _job(env, tmp_path, "release", baseline="release:latest",
                              **{"BASELINE-ALLOW-UNSIGNED": "true"})  # fmt: skip
    assert code == exitcodes.PROMOTABLE, out
    assert "| GREEN → GREEN | 32 | 0 | 0 | 0 | identical |" in summary
    assert (ws / "release" / "baseline" / first.name).read_bytes() == first.read_bytes()


def test_a_bad_baseline_fails_before_the_cell_runs(cell: dict[str, str], tmp_path: Path) -> None:
    ws = Path(cell["GITHUB_WORKSPACE"])
    (ws / "old").mkdir()
    (ws / "old" / "m__ctx512__N4.json").write_text('{"cert_version": 3, "tool_version": "0"}')
    code, summary, out = _job(cell, tmp_path, "x", baseline="old",
                              **{"BASELINE-ALLOW-UNSIGNED": "true"})  # fmt: skip
    assert code == exitcodes.CERT_INVALID, out
    assert "batch-invariance: live cell" not in out  # nothing ran
    assert not (ws / "x").exists() or not list((ws / "x").glob("*.json"))
    assert "cert invalid" in summary

    code, _, out = _job(cell, tmp_path, "y", baseline="old")
    assert code == exitcodes.USAGE and "baseline needs baseline-identity" in out


def test_require_none_only_with_a_baseline_and_never_for_a_mock_cert(tmp_path: Path) -> None:
    from batch_invariance.action.inputs import read_inputs
    from batch_invariance.action.outputs import require_holds
    from tests.support.factories import cert_for

    with pytest.raises(UsageError, match="require none leaves the job to the comparison"):
        read_inputs({"GITHUB_WORKSPACE": str(tmp_path), "INPUT_REQUIRE": "none"})
    env = {"GITHUB_WORKSPACE": str(tmp_path), "INPUT_REQUIRE": "none", "INPUT_BASELINE": "b.json"}
    got = read_inputs({**env, "INPUT_BASELINE-ALLOW-UNSIGNED": "true"})
    assert got.require == "none" and got.baseline.source == "b.json"
    unverified = cert_for(source="live", policy=replace(cert_for()[0].evidence.policy,
                                                        min_hot_trials=10_000))[0]  # fmt: skip
    assert unverified.status == "green_unverified"
    assert require_holds(unverified, "none") and not require_holds(unverified, "green")
    assert not require_holds(cert_for(source="mock")[0], "none")
