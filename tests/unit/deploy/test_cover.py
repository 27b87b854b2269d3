"""What a cert covers in a deploy (issue 17 §4): the server build, the answer-length scope of
an uncapped deploy, and the repository a signature was made for.

The certs are the same promotable live certs ``tests/unit/deploy/test_check_deploy.py`` builds
(the verdict decided by the core; a server binary and model file in tmp recorded in the
provenance). The repository rule is checked against the real public sigstore bundle in
``../shared/fixtures/sigstore`` (its certificate's source-repository claim is
``https://github.com/trailofbits/rfc8785.py``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.provenance import Provenance
from batch_invariance.cert.signature import (
    SignerPolicy,
    TrustRoot,
    load_bundle,
    policy_for,
    verify_bundle,
)
from batch_invariance.cert.signing import (
    GITHUB_ACTIONS_ISSUER,
)
from batch_invariance.cert.signing_policy import signing_policy
from batch_invariance.cli import build_parser, main
from batch_invariance.deploy.deploy_report import check_cells, load_deploy_cells
from batch_invariance.errors import CertInvalid, UsageError
from tests.unit.deploy.test_check_deploy import (
    MODEL,
    OK_FLAGS,
    SIGSTORE,
    _live_cert,
    assert_covered_raw,
    deploy_files,
    served,
)

WHEEL = "rfc8785-0.1.2-py3-none-any.whl"
RELEASE_SAN = (
    "https://github.com/trailofbits/rfc8785.py/.github/workflows/release.yml@refs/tags/v0.1.2"
)
needs_bundle = pytest.mark.skipif(
    not (SIGSTORE / WHEEL).is_file(), reason="the public sigstore fixture is not here"
)


@pytest.fixture(scope="module")
def cover(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("cover")
    model, binary = deploy_files(root)
    certs = root / "certs"
    green = _live_cert(certs, model)
    yield {"root": root, "model": model, "binary": binary, "certs": certs, "green": green}


def _run(cover: dict[str, Path], tmp_path: Path, body: str, *extra: str, name: str = "d.sh") -> int:
    config = tmp_path / name
    config.write_text(body)
    args = ["check-deploy", str(config), "--certs", str(cover["certs"]), *extra]
    return main([*args, "--allow-unsigned"] if "--cert-identity" not in extra else args)


def _longest(cover: dict[str, Path]) -> int:
    data = json.loads(cover["green"].read_text())
    longest = data["promotion_scope"]["answer_tokens_max"]
    assert isinstance(longest, int)
    return longest


# --------------------------------------------------------------------------- server build


def test_the_measured_build_passes_and_the_line_says_how_it_was_checked(
    cover: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = f"{cover['binary']} -m {cover['model']} {OK_FLAGS} -n 16"
    assert _run(cover, tmp_path, f"exec {served(engine, cover['certs'])}\n") == 0
    assert f"build by sha256 of {cover['binary']}" in capsys.readouterr().out
    # Started directly its cell is covered, and that is never a pass (issue 40).
    assert_covered_raw(_run(cover, tmp_path, f"{engine}\n"), capsys.readouterr().out)


def test_another_build_is_not_covered(
    cover: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "llama-server"
    other.write_bytes(b"\x7fELF another build")
    measured = hashlib.sha256(cover["binary"].read_bytes()).hexdigest()
    body = f"{other} -m {cover['model']} {OK_FLAGS}\n"
    assert _run(cover, tmp_path, body) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert f"server build sha256 {hashlib.sha256(other.read_bytes()).hexdigest()[:12]}" in out
    assert f"(measured {measured[:12]}...)" in out


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("/srv/nowhere/llama-server -m {model} {flags}\n",
         "server binary /srv/nowhere/llama-server not found here: its build (sha256) cannot be "
         "checked"),
        ("PATH=/srv/nowhere llama-server -m {model} {flags}\n",
         "program llama-server is not on the file's PATH here"),
    ],
    ids=["absent-path", "not-on-path"],
)  # fmt: skip
def test_a_binary_that_cannot_be_read_is_not_covered(
    cover: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    body: str,
    named: str,
) -> None:
    text = body.format(model=cover["model"], flags=OK_FLAGS)
    assert _run(cover, tmp_path, text) == exitcodes.NOT_PROMOTABLE
    assert named in capsys.readouterr().out


def test_a_container_or_a_registry_names_no_binary_here(
    cover: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "models").symlink_to(cover["model"].parent)
    compose = (
        "services:\n  llm:\n    image: ghcr.io/ggml-org/llama.cpp:server\n"
        f"    volumes: ['./models:/models']\n    command: -m /models/{MODEL}.gguf {OK_FLAGS}\n"
    )
    assert _run(cover, tmp_path, compose, name="compose.yml") == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert "runs inside the container image ghcr.io/ggml-org/llama.cpp:server" in out
    # --server-binary names the file the image runs: then the build is checked, and the cell
    # is covered (the image starts llama-server directly: never a pass, issue 40).
    flag = ("--server-binary", str(cover["binary"]))
    code = _run(cover, tmp_path, compose, *flag, name="compose.yml")
    assert_covered_raw(code, capsys.readouterr().out)
    config = tmp_path / "compose.yml"
    cells = load_deploy_cells(config).cells
    report = check_cells(config, cells, cover["certs"], None, server_binary=cover["binary"])
    (check,) = report.checks
    assert check.ok and f"build by sha256 of {cover['binary']} (--server-binary)" in check.reason


def test_a_cert_that_records_no_build_covers_no_deploy(
    cover: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from batch_invariance.cert.advice import engine_advice
    from batch_invariance.cert.build import rederive
    from batch_invariance.cert.parse import parse_cert
    from batch_invariance.cert.store import write_cert

    cert = parse_cert(cover["green"].read_text())
    provenance: dict[str, Any] = cert.provenance.record()
    del provenance["server_binary"]
    folder = tmp_path / "certs"
    write_cert(
        folder,
        rederive(replace(cert, provenance=Provenance.from_record(provenance)), engine_advice),
    )
    body = f"{cover['binary']} -m {cover['model']} {OK_FLAGS}\n"
    assert _run(cover, tmp_path, body, "--certs", str(folder)) == exitcodes.NOT_PROMOTABLE
    assert "the cert records no server binary sha256 (build unknown)" in capsys.readouterr().out


# --------------------------------------------------------------------------- answer length


@pytest.mark.parametrize("cap", ["", "-n -1", "--n-predict -1"], ids=["no-n", "n-1", "long"])
def test_an_uncapped_deploy_passes_only_with_its_scope_printed(
    cover: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], cap: str
) -> None:
    longest = _longest(cover)
    engine = f"{cover['binary']} -m {cover['model']} {OK_FLAGS} {cap}".rstrip()
    assert_covered_raw(_run(cover, tmp_path, f"{engine}\n"), capsys.readouterr().out)
    assert _run(cover, tmp_path, f"exec {served(engine, cover['certs'])}\n") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("pass  ")
    assert lines[0].endswith(
        f"covers answers up to {longest} tokens only: the deploy sets no -n cap"
    )
    assert lines[-1].startswith(
        f"check-deploy: PASS: 1 batched cell(s) certified; covers answers up to {longest} tokens"
    )


def test_a_capped_deploy_within_the_measured_length_prints_no_scope(
    cover: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = f"{cover['binary']} -m {cover['model']} {OK_FLAGS} -n {_longest(cover)}"
    assert _run(cover, tmp_path, f"exec {served(engine, cover['certs'])}\n") == 0
    out = capsys.readouterr().out
    assert "check-deploy: PASS" in out and "covers answers up to" not in out


def test_a_cert_that_records_no_answer_length_covers_no_cap_and_no_fixed_n(
    cover: dict[str, Path],
) -> None:
    from batch_invariance.engines.llama_server.flags import read_flags
    from batch_invariance.gate.cells import cell_of
    from batch_invariance.gate.certs import CertFile
    from batch_invariance.gate.coverage import config_differences
    from batch_invariance.gate.identity import identify_model
    from batch_invariance.gate.server_command import ServerCommand

    data = json.loads(cover["green"].read_text())
    argv = data["provenance"]["servers"][1]["argv"]
    bare = CertFile(cover["green"], Provenance(), None, True, None, MODEL, 1024, 4,
                    read_flags(argv))  # fmt: skip
    m = str(cover["model"])
    uncapped = "no -n cap: the cert records no measured answer length to scope a pass to"
    fixed = "-n 8: the cert records no measured answer length"
    for cap, named in [((), uncapped), (("-n", "-1"), uncapped), (("-n", "8"), fixed)]:
        cell = cell_of(ServerCommand("x", ("llama-server", "-m", m, *OK_FLAGS.split(), *cap), {}))
        diffs = config_differences(cell, bare, identify_model(cell.model_path, cell.model))
        assert named in diffs


# --------------------------------------------------------------------------- repository


def _policy(*flags: str) -> Any:
    args = build_parser().parse_args(["check-deploy", "d.sh", "--certs", ".", *flags])
    return signing_policy(args)


ISSUER = ("--cert-oidc-issuer", GITHUB_ACTIONS_ISSUER, "--offline")


def test_an_identity_without_a_repository_is_a_usage_error(
    cover: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = f"{cover['binary']} -m {cover['model']} {OK_FLAGS}\n"
    identity = ("--cert-identity", RELEASE_SAN, *ISSUER)
    assert _run(cover, tmp_path, body, *identity) == exitcodes.USAGE
    err = capsys.readouterr().err
    assert "check-deploy needs --repository OWNER/REPO" in err
    assert "every repository that calls the reusable cell workflow signs with the same" in err
    with pytest.raises(UsageError, match="not OWNER/REPO"):
        policy_for(_policy("--cert-identity", RELEASE_SAN, *ISSUER, "--repository", "x").signer)
    with pytest.raises(UsageError, match="not both"):
        _policy("--cert-identity", RELEASE_SAN, *ISSUER, "--repository", "o/r", "--any-repository")
    table = tmp_path / "policy.toml"
    table.write_text(f'identity = "{RELEASE_SAN}"\nissuer = "{GITHUB_ACTIONS_ISSUER}"\n')
    with pytest.raises(UsageError, match="needs --repository"):
        _policy("--signing-policy", str(table))
    table.write_text(table.read_text() + 'repository = "octo/deploy"\n')
    assert _policy("--signing-policy", str(table)).signer.repository == "octo/deploy"
    assert _policy("--cert-identity", RELEASE_SAN, *ISSUER, "--any-repository").signer == (
        SignerPolicy(RELEASE_SAN, GITHUB_ACTIONS_ISSUER, None)
    )


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sigstore's offline trust root needs a writable HOME."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)


@needs_bundle
@pytest.mark.usefixtures("home")
def test_the_source_repository_claim_decides_a_real_bundle(tmp_path: Path) -> None:
    """The identity alone accepts the bundle; the repository check reads the certificate's
    source-repository claim (1.3.6.1.4.1.57264.1.12) and refuses another repository."""
    wheel, bundle = SIGSTORE / WHEEL, SIGSTORE / f"{WHEEL}.sigstore.json"
    identity = ("--cert-identity", RELEASE_SAN, *ISSUER)
    verify_bundle(
        wheel, bundle, _policy(*identity, "--any-repository").signer, TrustRoot(offline=True)
    )
    good = _policy(*identity, "--repository", "trailofbits/rfc8785.py")
    verify_bundle(wheel, bundle, good.signer, good.trust)
    other = _policy(*identity, "--repository", "octo/deploy")
    with pytest.raises(CertInvalid) as refused:
        verify_bundle(wheel, bundle, other.signer, other.trust)
    assert str(refused.value) == (
        "signature repository mismatch: signed for source repository "
        "https://github.com/trailofbits/rfc8785.py, expected https://github.com/octo/deploy"
    )


@needs_bundle
def test_check_deploy_refuses_a_cert_signed_for_another_repository(
    cover: dict[str, Path], tmp_path: Path
) -> None:
    """check-deploy's policy applied to the real bundle's signing certificate (its claims;
    the bytes it signs are the wheel's, so the digest check is left to the test above)."""
    certificate = load_bundle(SIGSTORE / f"{WHEEL}.sigstore.json").signing_certificate

    def claims_only(artifact: Path, bundle: Path, wanted: SignerPolicy, trust: TrustRoot) -> None:
        from sigstore.errors import VerificationError

        from batch_invariance.cert.signature import (
            classify_failure,
        )

        try:
            policy_for(wanted).verify(certificate)
        except VerificationError as exc:
            raise CertInvalid(classify_failure(str(exc), wanted)) from None

    folder = tmp_path / "certs"
    shutil.copytree(cover["certs"], folder)
    (folder / (cover["green"].name + ".sigstore.json")).write_text("{}")
    config = tmp_path / "d.sh"
    config.write_text(f"{cover['binary']} -m {cover['model']} {OK_FLAGS}\n")
    cells = load_deploy_cells(config).cells
    identity = ("--cert-identity", RELEASE_SAN, *ISSUER)
    caller = _policy(*identity, "--repository", "trailofbits/rfc8785.py")
    passed = check_cells(config, cells, folder, caller, claims_only)
    assert passed.passed
    assert "signature verified, signed for trailofbits/rfc8785.py" in passed.checks[0].reason
    other = check_cells(
        config, cells, folder, _policy(*identity, "--repository", "o/r"), claims_only
    )
    assert [c.kind for c in other.checks] == ["invalid"]
    assert "signature repository mismatch: signed for source repository" in other.checks[0].reason
