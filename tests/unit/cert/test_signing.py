"""Sigstore signing and verification.

Verification runs offline against real public bundles beside the checkout: a PyPI wheel signed
in GitHub Actions on production (``../shared/fixtures/sigstore``) and a DSSE (in-toto) bundle
signed on staging (``../shared/fixtures/sigstore-dsse``); the tests skip when a folder is
absent. Signing runs up to the network boundary: ambient identity detection (against a
loopback stand-in for the Actions OIDC endpoint), token checks and the atomic bundle write,
with a fake in place of Fulcio/Rekor.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.attestation import (
    RESULT_OF_VERDICT,
    STATEMENT_TYPE,
    TEST_RESULT_PREDICATE,
    Subject,
    attest_file,
    attestation_path_for,
    check_subjects,
    statement_for,
    verify_attestation,
    verify_statement_bundle,
)
from batch_invariance.cert.signature import (
    SignerPolicy,
    TrustRoot,
    verify_bundle,
)
from batch_invariance.cert.signing import (
    GITHUB_ACTIONS_ISSUER,
    bundle_path_for,
    detect_token,
    identity_of,
    sign_file,
)
from batch_invariance.errors import CertInvalid, InfraError, UsageError
from tests.support.factories import cert_for
from tests.support.paths import SHARED_FIXTURES
from tests.unit.action.test_entrypoint import (
    FakeSigner,
    fake_github_jwt,
    oidc_endpoint,
    with_process_env,
)

FIXTURES = SHARED_FIXTURES / "sigstore"
WHEEL = "rfc8785-0.1.2-py3-none-any.whl"
IDENTITY = (
    "https://github.com/trailofbits/rfc8785.py/.github/workflows/release.yml@refs/tags/v0.1.2"
)
REPOSITORY = "trailofbits/rfc8785.py"
OFFLINE = TrustRoot(offline=True)

needs_fixture = pytest.mark.skipif(
    not (FIXTURES / WHEEL).is_file() or not (FIXTURES / f"{WHEEL}.sigstore.json").is_file(),
    reason=f"sigstore fixture folder absent: {FIXTURES}",
)


@pytest.fixture
def signed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A writable copy of the fixture wheel and its bundle, with a writable HOME."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    artifact = tmp_path / WHEEL
    bundle = tmp_path / f"{WHEEL}.sigstore.json"
    shutil.copyfile(FIXTURES / WHEEL, artifact)
    shutil.copyfile(FIXTURES / f"{WHEEL}.sigstore.json", bundle)
    return artifact, bundle


def _verify(artifact: Path, bundle: Path, identity: str = IDENTITY, **kw: object) -> None:
    signer = SignerPolicy(
        identity,
        str(kw.get("issuer", GITHUB_ACTIONS_ISSUER)),
        kw.get("repository", REPOSITORY),  # type: ignore[arg-type]
    )
    verify_bundle(artifact, bundle, signer, OFFLINE)


# --------------------------------------------------------------------------- verification


@needs_fixture
def test_good_bundle_verifies_offline(signed: tuple[Path, Path]) -> None:
    artifact, bundle = signed
    _verify(artifact, bundle)
    _verify(artifact, bundle, repository=None)


@needs_fixture
def test_failures_each_have_their_own_message(signed: tuple[Path, Path]) -> None:
    artifact, bundle = signed
    messages: dict[str, str] = {}

    with pytest.raises(CertInvalid) as wrong_identity:
        _verify(artifact, bundle, identity=IDENTITY.replace("v0.1.2", "v9.9.9"))
    messages["identity"] = str(wrong_identity.value)

    with pytest.raises(CertInvalid) as wrong_issuer:
        _verify(artifact, bundle, issuer="https://accounts.google.com")
    messages["issuer"] = str(wrong_issuer.value)

    with pytest.raises(CertInvalid) as wrong_repo:
        _verify(artifact, bundle, repository="octo/other")
    messages["repository"] = str(wrong_repo.value)

    changed = artifact.read_bytes()
    middle = len(changed) // 2
    artifact.write_bytes(changed[:middle] + bytes([changed[middle] ^ 0x01]) + changed[middle + 1 :])
    with pytest.raises(CertInvalid) as changed_byte:
        _verify(artifact, bundle)
    messages["byte"] = str(changed_byte.value)

    with pytest.raises(CertInvalid) as missing:
        _verify(artifact, bundle.with_name("absent.sigstore.json"))
    messages["missing"] = str(missing.value)

    corrupt = bundle.with_name("corrupt.sigstore.json")
    corrupt.write_text('{"mediaType": "nope"}')
    with pytest.raises(CertInvalid) as corrupt_exc:
        _verify(artifact, corrupt)
    messages["corrupt"] = str(corrupt_exc.value)

    assert messages["identity"].startswith("signature identity mismatch: signed by")
    assert IDENTITY in messages["identity"]
    assert f"signed by {IDENTITY}, expected" in messages["identity"]
    assert messages["issuer"].startswith("signature issuer mismatch")
    assert messages["repository"].startswith("signature repository mismatch")
    assert messages["byte"].startswith("signature does not cover these bytes (digest mismatch)")
    assert messages["missing"].startswith("signature bundle missing")
    assert messages["corrupt"].startswith("signature bundle corrupt")
    heads = {m.split(":", 1)[0] for m in messages.values()}
    assert len(heads) == len(messages), messages
    assert all("\n" not in m for m in messages.values())


def test_missing_bundle_needs_no_fixture(tmp_path: Path) -> None:
    artifact = tmp_path / "cert.json"
    artifact.write_text("{}")
    with pytest.raises(CertInvalid, match="signature bundle missing"):
        verify_bundle(
            artifact,
            bundle_path_for(artifact),
            SignerPolicy(IDENTITY, GITHUB_ACTIONS_ISSUER),
            OFFLINE,
        )
    with pytest.raises(UsageError, match="identity and an OIDC issuer"):
        verify_bundle(
            artifact, bundle_path_for(artifact), SignerPolicy("", GITHUB_ACTIONS_ISSUER), OFFLINE
        )


# --------------------------------------------------------------------------- signing


@pytest.fixture(scope="module")
def mock_cert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (mock-source) cert written by run-mock (the session's run, copied here)."""
    from tests.support.report_fixtures import mock_cert as run_mock_cert

    return run_mock_cert(tmp_path_factory.mktemp("certs"), 4)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "ACTIONS_", "INPUT_"))
    }
    env.update(extra)
    return env


@pytest.mark.parametrize("in_actions", [False, True], ids=["no-ci", "actions-without-permission"])
def test_sign_without_identity_fails_with_one_line(
    mock_cert: Path, tmp_path: Path, in_actions: bool
) -> None:
    cert = tmp_path / mock_cert.name
    shutil.copyfile(mock_cert, cert)
    env = _clean_env(HOME=str(tmp_path), **({"GITHUB_ACTIONS": "true"} if in_actions else {}))
    proc = subprocess.run(
        [sys.executable, "-m", "batch_invariance", "sign", str(cert)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == exitcodes.USAGE
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "permissions: id-token: write" in lines[0]
    assert not bundle_path_for(cert).exists()


def test_sign_rejects_a_malformed_token_before_any_network(mock_cert: Path, tmp_path: Path) -> None:
    cert = tmp_path / mock_cert.name
    shutil.copyfile(mock_cert, cert)
    proc = subprocess.run(
        [sys.executable, "-m", "batch_invariance", "sign", str(cert), "--identity-token", "x.y"],
        env=_clean_env(HOME=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == exitcodes.USAGE
    assert "identity token rejected" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_sign_refuses_a_tampered_cert(mock_cert: Path, tmp_path: Path) -> None:
    cert = tmp_path / mock_cert.name
    data = json.loads(mock_cert.read_text())
    data["status"] = "failed" if data["status"] != "failed" else "green"
    cert.write_text(json.dumps(data, sort_keys=True, indent=2))
    proc = subprocess.run(
        [sys.executable, "-m", "batch_invariance", "sign", str(cert), "--identity-token",
         fake_github_jwt()],
        env=_clean_env(HOME=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == exitcodes.CERT_INVALID
    assert not bundle_path_for(cert).exists()


def _ambient_token(token: str) -> str:
    """What the ambient detector returns from a loopback Actions token endpoint serving it."""
    with oidc_endpoint(token) as url:
        patch = with_process_env(
            {
                "GITHUB_ACTIONS": "true",
                "ACTIONS_ID_TOKEN_REQUEST_URL": url,
                "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "request-token",
                "NO_PROXY": "127.0.0.1,localhost",
            }
        )
        try:
            return detect_token(None)
        finally:
            patch.undo()


def test_ambient_github_identity_is_detected(tmp_path: Path) -> None:
    token = fake_github_jwt()
    assert _ambient_token(token) == token
    who = identity_of(token)
    assert who.identity == f"https://github.com/{'octo/repo/.github/workflows/cell.yml'}" + (
        "@refs/heads/main"
    )
    assert who.issuer == GITHUB_ACTIONS_ISSUER


def test_expired_token_is_rejected() -> None:
    with pytest.raises(UsageError, match="identity token rejected"):
        identity_of(fake_github_jwt(lifetime_s=-3600))


def test_sign_file_writes_bundle_atomically_and_keeps_old_one_on_failure(tmp_path: Path) -> None:
    artifact = tmp_path / "cell.json"
    artifact.write_text('{"status": "green"}\n')
    signer = FakeSigner()
    signed = sign_file(artifact, fake_github_jwt(), signer)
    assert signed.bundle == tmp_path / "cell.json.sigstore.json"
    first = signed.bundle.read_text()
    assert json.loads(first)["n_bytes"] == artifact.stat().st_size
    assert signer.calls[0][0] == artifact.read_bytes()

    class Failing:
        def sign(self, payload: bytes, token: str) -> str:
            raise InfraError("sigstore signing failed: no network")

        def sign_statement(self, statement: bytes, token: str) -> str:
            return self.sign(statement, token)

    with pytest.raises(InfraError):
        sign_file(artifact, fake_github_jwt(), Failing())
    assert signed.bundle.read_text() == first, "a failed signing never replaces a bundle"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cell.json", "cell.json.sigstore.json"]


# --------------------------------------------------------------------------- in-toto attestation

DSSE = SHARED_FIXTURES / "sigstore-dsse"
DSSE_BUNDLE = DSSE / "a.dsse.staging-rekor-v2.txt.sigstore.json"
DSSE_IDENTITY = (
    "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/"
    ".github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main"
)
DSSE_SUBJECT = "a0cfc71271d6e278e57cd332ff957c3f7043fdda354c4cbb190a30d56efa01bf"

needs_dsse = pytest.mark.skipif(
    not DSSE_BUNDLE.is_file(), reason=f"sigstore DSSE fixture folder absent: {DSSE}"
)


@pytest.fixture
def writable_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    return tmp_path


def _staging(offline: bool = True) -> TrustRoot:
    return TrustRoot(staging=True, offline=offline)


@needs_dsse
def test_real_staging_dsse_bundle_verifies_offline_with_its_subject(writable_home: Path) -> None:
    signer = SignerPolicy(DSSE_IDENTITY, GITHUB_ACTIONS_ISSUER)
    verified = verify_statement_bundle(DSSE_BUNDLE, signer, _staging())
    assert verified.statement["_type"] == STATEMENT_TYPE
    check_subjects(verified, (Subject("a.txt", DSSE_SUBJECT),))
    with pytest.raises(CertInvalid, match="subject digest mismatch"):
        check_subjects(verified, (Subject("a.txt", "0" * 64),))
    # The identity as a pattern covers the same signer (tag-or-SHA policies use this form).
    pattern = SignerPolicy(
        r"https://github\.com/sigstore-conformance/.+@refs/heads/main",
        GITHUB_ACTIONS_ISSUER,
        identity_is_regexp=True,
    )
    verify_statement_bundle(DSSE_BUNDLE, pattern, _staging())


@needs_dsse
def test_dsse_bundle_is_rejected_for_another_signer_issuer_or_instance(
    writable_home: Path,
) -> None:
    with pytest.raises(CertInvalid, match=r"^attestation identity mismatch: signed by https"):
        verify_statement_bundle(
            DSSE_BUNDLE, SignerPolicy(IDENTITY, GITHUB_ACTIONS_ISSUER), _staging()
        )
    with pytest.raises(CertInvalid, match=r"^attestation identity mismatch"):
        verify_statement_bundle(
            DSSE_BUNDLE,
            SignerPolicy(r"https://github\.com/addiplus/.*", GITHUB_ACTIONS_ISSUER, None, True),
            _staging(),
        )
    with pytest.raises(CertInvalid, match=r"^attestation issuer mismatch"):
        verify_statement_bundle(
            DSSE_BUNDLE, SignerPolicy(DSSE_IDENTITY, "https://accounts.google.com"), _staging()
        )
    # Signed on staging: the production trust root must not accept it.
    with pytest.raises(CertInvalid) as production:
        verify_statement_bundle(
            DSSE_BUNDLE, SignerPolicy(DSSE_IDENTITY, GITHUB_ACTIONS_ISSUER), TrustRoot(offline=True)
        )
    assert str(production.value).startswith("attestation not anchored in this Sigstore")
    assert "--staging" in str(production.value) and "\n" not in str(production.value)


@needs_dsse
def test_verify_cert_rejects_a_dsse_bundle_that_is_not_this_certs_test_result(
    mock_cert: Path, writable_home: Path
) -> None:
    # A real, validly signed statement about another file (SLSA provenance of a.txt) must not
    # pass as this cert's attestation.
    with pytest.raises(CertInvalid, match="not the Test Result predicate"):
        verify_attestation(
            mock_cert, DSSE_BUNDLE, SignerPolicy(DSSE_IDENTITY, GITHUB_ACTIONS_ISSUER), _staging()
        )
    proc = subprocess.run(
        [sys.executable, "-m", "batch_invariance", "verify-cert", str(mock_cert),
         "--attestation", str(DSSE_BUNDLE), "--cert-identity", DSSE_IDENTITY,
         "--cert-oidc-issuer", GITHUB_ACTIONS_ISSUER, "--staging", "--offline"],
        env=_clean_env(HOME=str(writable_home / "home")),
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == exitcodes.CERT_INVALID, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@needs_fixture
def test_production_bundle_is_rejected_by_a_staging_verifier(signed: tuple[Path, Path]) -> None:
    artifact, bundle = signed
    with pytest.raises(CertInvalid, match="not anchored in this Sigstore instance"):
        verify_bundle(
            artifact,
            bundle,
            SignerPolicy(IDENTITY, GITHUB_ACTIONS_ISSUER, REPOSITORY),
            TrustRoot(staging=True, offline=True),
        )
    verify_bundle(
        artifact,
        bundle,
        SignerPolicy(
            r"https://github\.com/trailofbits/rfc8785\.py/\.github/workflows/release\.yml@"
            r"(refs/tags/v[0-9.]+|[0-9a-f]{40})",
            GITHUB_ACTIONS_ISSUER,
            REPOSITORY,
            identity_is_regexp=True,
        ),
        OFFLINE,
    )


@pytest.mark.parametrize(
    ("verdict", "result"),
    [("GREEN", "PASSED"), ("AMBER", "WARNED"), ("RED", "FAILED"), ("UNVERIFIED", "FAILED")],
)
def test_verdict_maps_to_the_test_result(verdict: str, result: str) -> None:
    assert RESULT_OF_VERDICT[verdict] == result


def test_statement_of_a_live_cert_names_cert_model_and_server(tmp_path: Path) -> None:
    server = {"path": "/bin/llama-server", "sha256": "d" * 64}
    cert, _ = cert_for(extra_provenance={"server_binary": server})
    statement = statement_for(cert, "tiny.json", "c" * 64)
    prov = cert.provenance
    assert statement["_type"] == STATEMENT_TYPE
    assert statement["predicateType"] == TEST_RESULT_PREDICATE
    assert [s["digest"]["sha256"] for s in statement["subject"]] == [
        "c" * 64,
        prov.model_file and prov.model_file.sha256,
        prov.server_binary and prov.server_binary.sha256,
    ]
    assert prov.model_file is not None
    assert statement["subject"][1]["name"] == prov.model_file.name
    predicate = statement["predicate"]
    assert predicate["result"] == RESULT_OF_VERDICT[cert.verdict]
    (config,) = predicate["configuration"]
    assert config["name"] == f"{cert.model}/{cert.ctx}/{cert.dispatch_n}"
    assert config["annotations"]["parallel"] == cert.dispatch_n
    assert sorted(predicate["passedTests"] + predicate["failedTests"]) == sorted(cert.gates)


def test_sign_writes_a_dsse_attestation_through_the_loopback_token_endpoint(
    mock_cert: Path, tmp_path: Path
) -> None:
    cert = tmp_path / mock_cert.name
    shutil.copyfile(mock_cert, cert)
    token = fake_github_jwt()
    signer = FakeSigner()
    ambient = _ambient_token(token)
    assert ambient == token
    attested = attest_file(cert, ambient, signer)
    assert attested.bundle == attestation_path_for(cert)
    assert attested.bundle.name == cert.name + ".intoto.sigstore.json"
    assert attested.identity.identity.endswith("cell.yml@refs/heads/main")
    (statement,) = signer.statements
    import hashlib

    assert statement["subject"] == [
        {"name": cert.name, "digest": {"sha256": hashlib.sha256(cert.read_bytes()).hexdigest()}}
    ], "a mock cert has no model or server file: only the cert itself is attested"
    assert statement["predicate"]["result"] == "PASSED"  # the mock cert is GREEN
    assert statement["predicate"]["configuration"][0]["annotations"]["source"] == "mock"
    assert json.loads(attested.bundle.read_text())["fake_dsse_bundle"] is True
