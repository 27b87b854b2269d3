"""`batch-invariance compare`: golden human output, the JSON layout, exit codes, refusals and
the signature policy (both certs verified before anything is compared)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance.cert.schema import Cert
from batch_invariance.cert.signature import BundlePolicy, SignerPolicy, TrustRoot
from batch_invariance.cert.store import render
from batch_invariance.cli import main
from batch_invariance.core.compare import COMPARE_VERSION
from batch_invariance.errors import CertInvalid
from batch_invariance.report.compare_load import compare_inputs
from tests.support.factories import (
    changed,
    comparable_cert,
    green_evidence,
    make_trial,
    replace_trial,
    spec,
    transport_failure,
)
from tests.support.golden import check_golden


def _write(path: Path, cert: Cert) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(cert), encoding="utf-8")
    return path


def _changed_evidence():  # type: ignore[no-untyped-def]
    """One prompt of each class in the new build's arm A."""
    ev = green_evidence()
    drift = make_trial("t001")
    lps = list(drift.token_logprobs or ())
    lps[2] -= 0.03125
    ev = replace_trial(ev, "A", "t001", replace(drift, token_logprobs=tuple(lps)))
    tok = make_trial("t002")
    text = "answer-t0o2"
    ev = replace_trial(
        ev, "A", "t002",
        changed(tok, completion=text, tokens=tuple(text), extracted_answer=tok.extracted_answer),
    )  # fmt: skip
    sc = make_trial("t003")
    text = "answer-t3"
    ev = replace_trial(
        ev, "A", "t003", changed(sc, completion=text, tokens=tuple(text), extracted_answer=text)
    )
    return ev


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    monkeypatch.chdir(tmp_path)
    _write(Path("old/tiny-model__ctx2048__N4.json"), comparable_cert())
    new = comparable_cert(_changed_evidence(), binary_sha="22" * 32, ts_utc="2025-02-03T04:05:06Z")
    _write(Path("new/tiny-model__ctx2048__N4.json"), new)
    return "old/tiny-model__ctx2048__N4.json", "new/tiny-model__ctx2048__N4.json"


def test_human_output_golden_and_exit_1_on_a_scored_change(
    pair: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["compare", *pair, "--allow-unsigned"])
    out = capsys.readouterr().out
    check_golden("compare_changed.txt", out)
    assert code == 1


def test_json_output_layout(pair: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["compare", *pair, "--allow-unsigned", "--json", "--fail-on", "tokens"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert data["compare_version"] == COMPARE_VERSION
    assert data["worst"] == "scored" and data["comparable"] is True
    assert data["counts"] == {
        "identical": 29, "unchecked": 0, "drift": 1, "tokens": 1, "scored": 1, "uncompared": 0,
    }  # fmt: skip
    (cell,) = data["cells"]
    assert cell["verdict"] == {"baseline": "GREEN", "new": "RED"}
    assert [c["prompt_class"] for c in cell["changes"]] == ["drift", "tokens", "scored"]
    scored = cell["changes"][2]
    assert scored["field"] == "extracted_answer"
    assert (scored["old"], scored["new"]) == ("answer-t003", "answer-t3")
    assert scored["first_divergent_token"] == 8
    assert cell["baseline"]["build"] == "llama-server@111111111111"
    assert data["policy"] == {
        "fail_on": "tokens",
        "failed": True,
        "reasons": [
            "tiny-model ctx 2048 N 4: 1 prompt(s) scored",
            "tiny-model ctx 2048 N 4: 1 prompt(s) tokens",
        ],
    }


def test_out_file_matches_stdout_json(
    pair: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    main(["compare", *pair, "--allow-unsigned", "--json", "--out", "cmp.json"])
    assert json.loads(Path("cmp.json").read_text()) == json.loads(capsys.readouterr().out)


def test_identical_exits_0_and_golden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(Path("a.json"), comparable_cert())
    _write(Path("b.json"), comparable_cert(binary_sha="33" * 32))
    assert main(["compare", "a.json", "b.json", "--allow-unsigned"]) == 0
    check_golden("compare_identical.txt", capsys.readouterr().out)
    assert main(["compare", "a.json", "b.json", "--allow-unsigned", "--fail-on", "drift"]) == 0


def test_drift_or_tokens_only_exit_3_and_pass_the_default_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    drift = make_trial("t001")
    lps = list(drift.token_logprobs or ())
    lps[0] += 1e-6
    ev = replace_trial(green_evidence(), "A", "t001", replace(drift, token_logprobs=tuple(lps)))
    _write(Path("a.json"), comparable_cert())
    _write(Path("b.json"), comparable_cert(ev))
    assert main(["compare", "a.json", "b.json", "--allow-unsigned"]) == 3
    assert main(["compare", "a.json", "b.json", "--allow-unsigned", "--fail-on", "scored"]) == 0
    assert main(["compare", "a.json", "b.json", "--allow-unsigned", "--fail-on", "drift"]) == 1


def test_uncompared_prompt_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ev = replace_trial(green_evidence(), "A", "t004", transport_failure("t004"))
    _write(Path("a.json"), comparable_cert())
    _write(Path("b.json"), comparable_cert(ev))
    assert main(["compare", "a.json", "b.json", "--allow-unsigned"]) == 3
    assert main(["compare", "a.json", "b.json", "--allow-unsigned", "--fail-on", "scored"]) == 1


def test_not_comparable_says_why_compares_nothing_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(Path("a.json"), comparable_cert())
    _write(Path("b.json"), comparable_cert(_changed_evidence(), workset={"sha256": "98" * 32}))
    assert main(["compare", "a.json", "b.json", "--allow-unsigned"]) == 2
    out = capsys.readouterr().out
    check_golden("compare_not_comparable.txt", out)
    assert "scored" not in out.split("NOT COMPARABLE")[1].split("worst")[0]
    assert main(["compare", "a.json", "b.json", "--allow-unsigned", "--fail-on", "never"]) == 2


def test_folders_pair_cells_by_model_ctx_and_n(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for n in (2, 4):
        _write(Path(f"old/m__ctx2048__N{n}.json"), comparable_cert(cell=spec(n=n)))
    _write(Path("new/m__ctx2048__N4.json"), comparable_cert(cell=spec(n=4)))
    _write(Path("new/m__ctx2048__N8.json"), comparable_cert(cell=spec(n=8)))
    Path("new/sweep.json").write_text('{"sweep_version": 1}')  # no cert: skipped
    assert main(["compare", "old", "new", "--allow-unsigned", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [c["dispatch_n"] for c in data["cells"]] == [4]
    assert [r["dispatch_n"] for r in data["baseline_only"]] == [2]
    assert [r["dispatch_n"] for r in data["new_only"]] == [8]


def test_an_invalid_cert_is_refused_before_anything_is_compared(
    pair: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    old = json.loads(Path(pair[0]).read_text())
    old["status"] = "green_with_caveat"  # edited, not re-digested
    Path(pair[0]).write_text(json.dumps(old))
    assert main(["compare", *pair, "--allow-unsigned"]) == 5
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "digest mismatch" in captured.err and len(captured.err.splitlines()) == 1


def test_signature_policy_is_required_like_check_deploy(
    pair: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", *pair]) == 2
    assert "compare verifies every cert's signature" in capsys.readouterr().err
    args = ["--cert-identity", "me", "--cert-oidc-issuer", "https://issuer"]
    assert main(["compare", *pair, *args]) == 2
    assert "compare needs --repository" in capsys.readouterr().err
    # with a policy, an unsigned cert is refused (exit 5) before anything is compared
    assert main(["compare", *pair, *args, "--repository", "o/r", "--offline"]) == 5
    err = capsys.readouterr().err
    assert "not signed (no tiny-model__ctx2048__N4.json.sigstore.json beside it)" in err


def test_each_bundle_is_checked_with_the_policy(pair: tuple[str, str]) -> None:
    for p in pair:
        Path(p + ".sigstore.json").write_text("{}")
    policy = BundlePolicy(SignerPolicy("me", "https://issuer", "o/r"), TrustRoot(offline=True))
    checked: list[tuple[str, SignerPolicy]] = []

    def accept(artifact: Path, bundle: Path, wanted: SignerPolicy, trust: TrustRoot) -> None:
        checked.append((str(artifact), wanted))

    result = compare_inputs(Path(pair[0]), Path(pair[1]), policy, accept)
    assert [c[0] for c in checked] == list(pair)
    assert all(w == policy.signer for _, w in checked)
    assert result.signatures == "verified for me (https://issuer), signed for o/r"

    def reject(artifact: Path, bundle: Path, wanted: SignerPolicy, trust: TrustRoot) -> None:
        if "new" in str(artifact):
            raise CertInvalid(f"{artifact}: signed by someone else")

    with pytest.raises(CertInvalid, match="signed by someone else"):
        compare_inputs(Path(pair[0]), Path(pair[1]), policy, reject)


def test_missing_input_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(tmp_path / "nope"), str(tmp_path), "--allow-unsigned"]) == 2
    assert "not found" in capsys.readouterr().err
