"""`batch-invariance verify-cert` end to end through cli.main."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_invariance.cert.schema import compute_digest
from batch_invariance.cert.store import write_cert
from batch_invariance.cert.verify import verify
from batch_invariance.cli import main
from tests.support.factories import cert_for, changed, green_evidence, replace_trial


def _write(tmp_path: Path, **kw: object) -> Path:
    cert, _ = cert_for(**kw)  # type: ignore[arg-type]
    return write_cert(tmp_path, cert).path


def test_good_green_live_cert_exits_0_and_prints_the_cell(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _write(tmp_path)
    assert main(["verify-cert", str(path)]) == 0
    out = capsys.readouterr().out
    assert "model=tiny-model ctx=2048 N=4" in out and "GREEN" in out
    assert "promotable: yes" in out and "source:     live" in out and "AC clean" in out


def test_mock_cert_is_valid_but_not_promotable(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["verify-cert", str(_write(tmp_path, source="mock"))]) == 3
    assert "promotable: no" in capsys.readouterr().out


def test_red_cert_exits_1(tmp_path: Path) -> None:
    ev = green_evidence()
    ev = replace_trial(ev, "C", "t001", changed(ev.c_passes[0].trials["t001"], score=0.0))
    assert main(["verify-cert", str(_write(tmp_path, evidence=ev))]) == 1


def test_unverified_cert_exits_3(tmp_path: Path) -> None:
    assert main(["verify-cert", str(_write(tmp_path, evidence=green_evidence(n_ids=6)))]) == 3


def test_tampered_byte_fails_digest_with_exit_5(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _write(tmp_path)
    raw = bytearray(path.read_bytes())
    at = raw.index(b'"ctx": 2048') + len(b'"ctx": 204')
    raw[at : at + 1] = b"9"
    path.write_bytes(bytes(raw))
    assert main(["verify-cert", str(path)]) == 5
    err = capsys.readouterr().err
    assert "digest mismatch" in err and "Traceback" not in err and err.count("\n") == 1


def test_status_edited_and_redigested_fails_rederivation(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _write(tmp_path, evidence=green_evidence(n_ids=6))
    data = json.loads(path.read_text())
    data.update(status="green", verdict="GREEN")
    data["digest"] = compute_digest(data)
    path.write_text(json.dumps(data, sort_keys=True, indent=2))
    assert main(["verify-cert", str(path)]) == 5
    err = capsys.readouterr().err
    assert "stored status 'green'" in err and "'green_unverified'" in err


def test_evidence_edited_and_redigested_fails_rederivation(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = json.loads(path.read_text())
    data["evidence"]["c_passes"][0]["trials"]["t002"]["score"] = 0.0
    data["digest"] = compute_digest(data)
    path.write_text(json.dumps(data))
    assert main(["verify-cert", str(path)]) == 5


def test_a_malformed_file_exits_5_and_a_missing_one_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "x", ')
    assert main(["verify-cert", str(bad)]) == 5
    # A path that is not there is the command line's fault, not a cert's (commands/cert_paths).
    assert main(["verify-cert", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert "not valid JSON" in err and "nope.json: no such file; check the path" in err


def test_missing_bundle_has_its_own_message(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _write(tmp_path)
    code = main(
        [
            "verify-cert",
            str(path),
            "--bundle",
            str(tmp_path / "x.sigstore.json"),
            "--cert-identity",
            "me@example.com",
            "--cert-oidc-issuer",
            "https://issuer",
        ]
    )
    assert code == 5
    assert "signature bundle not found" in capsys.readouterr().err


def test_bundle_without_identity_is_a_usage_error(tmp_path: Path) -> None:
    path = _write(tmp_path)
    bundle = tmp_path / "b.sigstore.json"
    bundle.write_text("{}")
    assert main(["verify-cert", str(path), "--bundle", str(bundle)]) == 2
    assert main(["verify-cert", str(path), "--cert-identity", "x"]) == 2


def test_corrupt_bundle_is_cert_invalid(tmp_path: Path) -> None:
    path = _write(tmp_path)
    bundle = tmp_path / "b.sigstore.json"
    bundle.write_text('{"not": "a bundle"}')
    code = main(
        [
            "verify-cert",
            str(path),
            "--bundle",
            str(bundle),
            "--cert-identity",
            "me@example.com",
            "--cert-oidc-issuer",
            "https://issuer",
            "--offline",
        ]
    )
    assert code == 5


def test_verify_raise_if_invalid_report(tmp_path: Path) -> None:
    report = verify(_write(tmp_path)).raise_if_invalid()
    assert report.status == "green" and report.verdict == "GREEN" and report.promotable
    assert report.cert is not None and report.cert.dispatch_n == 4 and report.valid
    assert report.promotable_reasons and not report.problems


@pytest.mark.parametrize("payload", ["", "null", "123", '"text"'])
def test_non_object_json_is_invalid(tmp_path: Path, payload: str) -> None:
    bad = tmp_path / "c.json"
    bad.write_text(payload)
    assert main(["verify-cert", str(bad)]) == 5
