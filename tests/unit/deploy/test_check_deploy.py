"""`check-deploy` against real cert files (tests/support/deploy_world.py): a cert covers exactly
the cell it measured, and only a deploy that starts it through `serve` passes (issue 40)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.signature import SignerPolicy, policy_for, verify_bundle
from batch_invariance.cert.signing import GITHUB_ACTIONS_ISSUER
from batch_invariance.cli import main
from batch_invariance.core.evidence import GatePolicy
from batch_invariance.deploy.deploy_report import check_cells, load_deploy_cells
from batch_invariance.errors import CertInvalid, UsageError
from tests.support import deploy_world as dw
from tests.support.deploy_world import MODEL, OK_FLAGS, Capsys, World, _unsigned, served

SERVE_OK = "exec {serve} llama-server -m {m} {ok}"
UNCAPPED = "covers answers up to {longest} tokens only: the deploy sets no -n cap\ncheck-deploy:"
BARE = "exec batch-invariance serve --certs {certs} --allow-unsigned -- {binary} -m {m} {ok}"
#: Each deploy (a template of :func:`case_fields`) with its decision and the words that say why.
CASES = [
    pytest.param(SERVE_OK, "pass", (
        f"pass  {MODEL} ctx=1024 N=4 kv=split", "model by sha256",
        "check-deploy: PASS: 1 batched cell(s) certified; covers answers up to {longest} tokens "
        "(no -n cap in 1 cell(s): longer answers were never measured) (UNSIGNED: "
        "--allow-unsigned, signatures not checked)"), id="serve"),
    pytest.param("llama-server -m {m} -c 1024 -np 1", "pass", ("parallel 1: no batching",),
                 id="serial"),
    # A second launch is refused: a deploy starts serve once, even beside a serial server.
    pytest.param("llama-server -m {m} -c 1024 -np 1\n" + SERVE_OK, "fail",
                 (":3: not understood: a second launch",), id="second-launch"),
    # Limits, logging and neutral exports around the one serve line pass ...
    pytest.param("#!/bin/bash\nset -euo pipefail\nulimit -n 65536\numask 027\nexport LANG=C.UTF-8"
                 "\necho starting >>/tmp/llm.log\n" + SERVE_OK + " >>/tmp/llm.log 2>&1", "pass",
                 (), id="limits-and-logging"),
    # ... an environment that reaches the Python running serve never does.
    pytest.param("export PYTHONPATH=/tmp\n" + SERVE_OK, "fail",
                 ("environment PYTHONPATH reaches the Python",), id="pythonpath"),
    pytest.param("export LD_PRELOAD=/tmp/x.so\n" + SERVE_OK, "fail",
                 ("environment LD_PRELOAD reaches the Python",), id="ld-preload"),
    pytest.param("LD_LIBRARY_PATH=/tmp " + SERVE_OK, "fail",
                 ("environment LD_LIBRARY_PATH reaches the Python",), id="ld-library-path"),
    # A bare launcher runs the first on PATH: no folder others can write, nor a relative one,
    # may come before its own.
    pytest.param("export PATH={toolbin}:/usr/bin\n" + BARE, "pass", (), id="launcher-on-path"),
    pytest.param("export PATH={open}:{toolbin}\n" + BARE, "fail", ("is searched before",),
                 id="launcher-after-open-folder"),
    pytest.param("export PATH=bin:{toolbin}\n" + BARE, "fail", ("is relative",),
                 id="launcher-after-relative"),
    pytest.param("[Service]\nExecStart={serve} {binary} -m {m} {ok}", "pass", (), id="unit"),
    pytest.param("[Service]\nExecStart={binary} -m {m} {ok}", "raw", (), id="unit-raw"),
    # N from the environment, elsewhere in the file or in the unit.
    pytest.param("export LLAMA_ARG_N_PARALLEL=8\nllama-server -m {m} -c 8192 -ub 1 -cram 0", "fail",
                 (f"FAIL  {MODEL} ctx=1024 N=8 kv=split",), id="n-from-env"),
    pytest.param("[Unit]\nDescription=llama-server\n[Service]\nEnvironment=LLAMA_ARG_N_PARALLEL=16"
                 "\nExecStart=/usr/bin/llama-server -m {m} -c 16384 -ub 1 {off}", "fail",
                 (f"FAIL  {MODEL} ctx=1024 N=16 kv=split", "1 of 1 batched"), id="n-from-unit"),
    # Variables from a file could set anything: EnvironmentFile= is off the allowlist.
    pytest.param("[Service]\nEnvironmentFile=/etc/nowhere/llm.env\nExecStart={binary} -m {m} {ok}",
                 "fail", ("llama-server.service:2: not understood: EnvironmentFile= in [Service] "
                          "(not on the allowlist)",), id="environment-file"),
    # A mock run records no model file and a mock server argv: it measured no deploy cell.
    pytest.param("llama-server -m {m} -c 2048 -np 2 -ub 1 {off}", "fail",
                 (f"FAIL  {MODEL} ctx=1024 N=2 kv=split", "no cert measured this cell"), id="mock"),
    pytest.param("llama-server -m {other} {ok}", "fail", ("model sha256",), id="other-model"),
    # A model file that is not here cannot be identified, and is never matched by name.
    pytest.param("llama-server -m /srv/nowhere/{name} {ok}", "fail",
                 ("not found here: its identity (sha256, or size and name)",), id="model-not-here"),
    pytest.param("llama-server -m {m} {ok} -n {over}", "fail", (
        "-n {over}: the cert measured answers up to {longest} tokens only", "!covers this cell"),
        id="n-longer"),
    pytest.param("exec {serve} llama-server -m {m} {ok} -n {over}", "fail",
                 ("-n {over}: the cert measured answers up to {longest} tokens only",),
                 id="n-longer-serve"),
    pytest.param("LLAMA_ARG_N_PREDICT={over} llama-server -m {m} {ok}", "fail",
                 ("-n {over}: the cert measured", "!covers this cell"), id="n-longer-env"),
    pytest.param("llama-server -m {m} {ok} -n {longest}", "raw", (), id="n-measured"),
    pytest.param("exec {serve} llama-server -m {m} {ok} -n {longest}", "pass",
                 ("!covers answers up to",), id="n-measured-serve"),
    # The build: the measured one, another, one not here, a program not on PATH.
    pytest.param("exec {serve} {binary} -m {m} {ok} -n 16", "pass",
                 ("build by sha256 of {binary}",), id="measured-build"),
    pytest.param("{binary} -m {m} {ok} -n 16", "raw", (), id="measured-build-raw"),
    pytest.param("{other_bin} -m {m} {ok}", "fail",
                 ("server build sha256 {other_sha}", "(measured {sha}...)"), id="another-build"),
    pytest.param("/srv/nowhere/llama-server -m {m} {ok}", "fail", (
        "server binary /srv/nowhere/llama-server not found here: its build (sha256) cannot be "
        "checked",), id="absent-path"),
    pytest.param("PATH=/srv/nowhere llama-server -m {m} {ok}", "fail",
                 ("program llama-server is not on the file's PATH here",), id="not-on-path"),
    # An uncapped deploy passes only with the answer length it is covered for on its line.
    *(pytest.param(f"exec {{serve}} {{binary}} -m {{m}} {{ok}} {cap}", "pass", (UNCAPPED,),
                   id=f"uncapped{cap}") for cap in ("", "-n -1", "--n-predict -1")),
    *(pytest.param(f"{{binary}} -m {{m}} {{ok}} {cap}", "raw", (), id=f"uncapped-raw{cap}")
      for cap in ("", "-n -1", "--n-predict -1")),
]  # fmt: skip


@pytest.mark.parametrize(("body", "expect", "words"), CASES)
def test_each_deploy_gets_its_decision(
    world: World, tmp_path: Path, capsys: Capsys, body: str, expect: str, words: tuple[str, ...]
) -> None:
    fields = dw.case_fields(world, tmp_path)
    code = _unsigned(world, tmp_path, body.format(**fields) + "\n")
    dw.assert_decision(code, capsys.readouterr().out, expect, *(w.format(**fields) for w in words))


def test_a_covered_cell_passes_only_started_through_serve(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    """Started directly, the output names the covering cert and the serve line to write (its
    exact words: tests/golden/check_deploy.txt); --suggest prints that line alone, and pasted
    into the deploy (the tool by its path) it passes."""
    certs, engine = world["certs"], f"llama-server -m {world['model']} {OK_FLAGS} -n 64"
    dw.assert_covered_raw(_unsigned(world, tmp_path, f"exec {engine}\n"), capsys.readouterr().out)
    cmd = f"batch-invariance serve --certs {certs} --allow-unsigned -- {engine}"
    args = ["check-deploy", str(tmp_path / "llama-server.sh"), "--certs", str(certs)]
    assert main([*args, "--allow-unsigned", "--suggest"]) == exitcodes.NOT_PROMOTABLE
    assert capsys.readouterr().out == f"# llama-server.sh:2: {MODEL} ctx=1024 N=4 kv=split\n{cmd}\n"
    code = _unsigned(world, tmp_path, f"exec {dw.TOOL}{cmd.removeprefix('batch-invariance')}\n")
    out = capsys.readouterr().out
    dw.assert_decision(code, out, "pass", "kv=split  [llama-server.sh:2]  promotable", "!directly")


@pytest.mark.parametrize(
    "flags",
    [f"-c 4096 -np 4 -kvu -ub 1 {dw.CACHE_OFF}", f"-c 4096 -ub 1 {dw.CACHE_OFF}"],
    ids=["kvu", "no-np"],
)
def test_unified_kv_is_covered_only_where_the_sequences_reach_the_pool(
    world: World, tmp_path: Path, capsys: Capsys, flags: str
) -> None:
    """Any slot of a unified pool may fill the whole pool (issue 40): a cert whose sequences
    reached a 1024-token share does not cover the 4096-token pool; one past 3/4 of it does."""
    engine = f"llama-server -m {world['model']} {flags}"
    unified, split = world["unified"], f"llama-server -m {world['model']} {OK_FLAGS}"
    for body, certs, why in [
        (engine, world["certs"], (f"FAIL  {MODEL} ctx=1024 N=4 kv=unified",
                                  "KV layout unified (measured split)")),
        (engine, unified, ("but the slot is 4096 tokens (need >= 3072, 3/4 of it)",)),
        (f"exec {served(engine, unified)}", unified, ("the slot is 4096 tokens",)),
        (split, unified, ("KV layout split (measured unified)",)),  # nor the split layout
    ]:  # fmt: skip
        code = _unsigned(world, tmp_path, f"{body}\n", certs=certs)
        dw.assert_decision(code, capsys.readouterr().out, "fail", *why, "!covers this cell")
    pooled = tmp_path / "pooled"
    dw._live_cert(pooled, world["model"], layout="unified", reach=4096)
    code = _unsigned(world, tmp_path, f"{engine}\n", certs=pooled)
    dw.assert_decision(code, capsys.readouterr().out, "fail", "covers this cell", "!the slot is")
    code = _unsigned(world, tmp_path, f"exec {served(engine, pooled)}\n", certs=pooled)
    assert code == exitcodes.PROMOTABLE, capsys.readouterr().out


def _tamper(green: Path, model: Path) -> None:
    data = json.loads(green.read_text())
    data["sensitivity"]["n_hot_trials"] += 1000
    green.write_text(json.dumps(data, sort_keys=True, indent=2))


def _loosen(green: Path, model: Path) -> None:
    green.unlink()
    dw._live_cert(green.parent, model, policy=GatePolicy(min_hot_trials=1))


def _not_certs(green: Path, model: Path) -> None:
    (green.parent / "broken.json").write_text("{")
    nan = json.loads(green.read_text())
    nan["sensitivity"]["rate_upper_bound_95"] = float("nan")
    (green.parent / "nan.json").write_text(json.dumps(nan))
    (green.parent / "huge.json").write_text('{"model": "m", "ctx": ' + "9" * 5000 + "}")


@pytest.mark.parametrize(
    ("change", "flags", "code", "words"),
    [
        (_tamper, OK_FLAGS, exitcodes.CERT_INVALID, ("is invalid",)),
        (_loosen, OK_FLAGS, exitcodes.NOT_PROMOTABLE, ("is not promotable (", "min_hot_trials 1")),
        (_not_certs, "-c 8192 -np 8", exitcodes.NOT_PROMOTABLE, (
            "broken.json (not a readable cert", "nan.json (not a readable cert",
            "huge.json (not a readable cert")),
    ],
    ids=["tampered", "looser-policy", "not-certs"],
)  # fmt: skip
def test_a_cert_that_cannot_cover_is_named(
    world: World, tmp_path: Path, capsys: Capsys, change: Callable[[Path, Path], None],
    flags: str, code: int, words: tuple[str, ...],
) -> None:  # fmt: skip
    folder = shutil.copytree(world["certs"], tmp_path / "certs")
    change(folder / world["green"].name, world["model"])
    engine = f"llama-server -m {world['model']} {flags}"
    for body in (f"exec {served(engine, folder)}", engine):
        assert _unsigned(world, tmp_path, f"{body}\n", certs=folder) == code
        out = capsys.readouterr().out
        assert "check-deploy: PASS" not in out and "covers this cell" not in out, out
        assert all(word in out for word in words), out


ISSUER = ("--cert-oidc-issuer", GITHUB_ACTIONS_ISSUER)
WHEEL = "rfc8785-0.1.2-py3-none-any.whl"
IDENTITY = ("--cert-identity", "https://github.com/o/r/.github/workflows/c.yml@refs/tags/v1")
TAG_SAN = "https://github.com/addiplus/batch-invariance/.github/workflows/cell.yml@refs/tags/v0.3.1"
TAG_OR_SHA = (
    r"^https://github\.com/addiplus/batch-invariance/\.github/workflows/cell\.yml"
    r"@(refs/tags/v[0-9]+(\.[0-9]+)*|[0-9a-f]{40})$"
)
RELEASE = r"https://github\.com/trailofbits/rfc8785\.py/\.github/workflows/release\.yml@"
RELEASE_SAN = RELEASE.replace("\\", "") + "refs/tags/v0.1.2"
BUNDLE = dw.SIGSTORE / f"{WHEEL}.sigstore.json"
SIGNED_FIXTURE = pytest.mark.skipif(not BUNDLE.is_file(), reason="the public sigstore fixture")


def test_an_unsigned_cert_is_refused_where_signatures_are_required(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    body, policy = f"llama-server -m {world['model']} {OK_FLAGS}\n", (*IDENTITY, *ISSUER)
    assert dw._check(world, tmp_path, body, *policy, "--offline", "--repository", "o/d") == 3
    assert "is not signed (no " in capsys.readouterr().out
    assert dw._check(world, tmp_path, body, *policy) == exitcodes.USAGE  # the table's words


@pytest.mark.parametrize(
    ("flags", "toml", "made"),
    [
        ((), "", "verifies every cert's signature: pass --cert-identity"),  # nor --allow-unsigned
        (("--allow-unsigned", *IDENTITY), "", "--allow-unsigned skips signatures"),
        # An identity names no repository: every repository that calls cell.yml signs with it.
        ((*IDENTITY, *ISSUER), "", "check-deploy needs --repository OWNER/REPO .* every "
         "repository that calls the reusable cell workflow signs with the same"),
        (("--cert-identity-regexp", "(unclosed", *ISSUER, "--repository", "o/d"), "",
         "not a valid regex"),
        (("--cert-identity", TAG_SAN, "--cert-identity-regexp", TAG_OR_SHA, *ISSUER), "",
         "not allowed with"),  # one identity flag or the other
        (("--cert-identity", TAG_SAN, *ISSUER, "--repository", "x"), "", "not OWNER/REPO"),
        ((*IDENTITY, *ISSUER, "--repository", "o/r", "--any-repository"), "", "not both"),
        ((), f'identity = "{TAG_SAN}"\nidentity_regexp = "x"\nissuer = "{GITHUB_ACTIONS_ISSUER}"\n',
         "not both"),
        ((), f'identity = "{TAG_SAN}"\nissuer = "{GITHUB_ACTIONS_ISSUER}"\n', "needs --repository"),
        ((), f"identity_regexp = '{TAG_OR_SHA}'\nissuer = \"{GITHUB_ACTIONS_ISSUER}\"\n"
         'repository = "o/deploy"\n',
         SignerPolicy(TAG_OR_SHA, GITHUB_ACTIONS_ISSUER, "o/deploy", identity_is_regexp=True)),
        ((), f'identity = "{TAG_SAN}"\nissuer = "{GITHUB_ACTIONS_ISSUER}"\nrepository = "o/d"\n',
         SignerPolicy(TAG_SAN, GITHUB_ACTIONS_ISSUER, "o/d")),
        (("--cert-identity", TAG_SAN, *ISSUER, "--any-repository"), "",
         SignerPolicy(TAG_SAN, GITHUB_ACTIONS_ISSUER, None)),
    ],
)  # fmt: skip
def test_the_signing_policy_from_flags_or_a_file(
    tmp_path: Path, flags: tuple[str, ...], toml: str, made: str | SignerPolicy
) -> None:
    """The signer policy made, or the usage error (its words) that refuses the flags."""
    if toml:
        (tmp_path / "policy.toml").write_text(toml)
        flags = ("--signing-policy", str(tmp_path / "policy.toml"))
    if isinstance(made, SignerPolicy):
        policy = dw.policy_from(*flags)
        assert policy is not None and policy.signer == made
        return
    with pytest.raises(UsageError, match=made):
        policy = dw.policy_from(*flags)
        assert policy is not None
        policy_for(policy.signer)


@SIGNED_FIXTURE
def test_a_bundle_of_another_file_is_rejected(world: World, tmp_path: Path, capsys: Capsys) -> None:
    folder = shutil.copytree(world["certs"], tmp_path / "certs")
    shutil.copy(BUNDLE, folder / f"{world['green'].name}.sigstore.json")
    policy = tmp_path / "signing.toml"
    policy.write_text(f'identity = "{RELEASE_SAN}"\nissuer = "{GITHUB_ACTIONS_ISSUER}"\n'
                      'repository = "trailofbits/rfc8785.py"\n')  # fmt: skip
    args = ("--signing-policy", str(policy), "--offline")
    engine = f"llama-server -m {world['model']} {OK_FLAGS}"
    body = f"exec {served(engine, folder, *args)}\n"
    assert dw._check(world, tmp_path, body, *args, certs=folder) == exitcodes.CERT_INVALID
    assert "digest mismatch" in capsys.readouterr().out


def test_models_toml_and_usage_errors(world: World, tmp_path: Path, capsys: Capsys) -> None:
    # run-live's registry names no binary and starts no serve: never a deploy (issue 40).
    config = tmp_path / "models.toml"
    config.write_text(f'[[models]]\nalias = "g"\ngguf = "{world["model"]}"\nkv = "f16"\n')
    args = ["check-deploy", str(config), "--certs", str(world["certs"]), "--allow-unsigned"]
    assert main(args) == exitcodes.USAGE
    said = capsys.readouterr()
    assert "models.toml: a .toml file is a model registry, not a deploy" in said.err
    assert "Traceback" not in said.out + said.err
    body = f"llama-server -m {world['model']} {OK_FLAGS}\n"
    assert _unsigned(world, tmp_path, body, certs=tmp_path / "nope") == exitcodes.USAGE
    assert main([*args[:1], str(tmp_path / "missing.sh"), *args[2:]]) == exitcodes.USAGE


@pytest.mark.parametrize(
    ("san", "repository", "refused"),
    [
        (TAG_SAN, "o/deploy", None),
        (TAG_SAN.replace("refs/tags/v0.3.1", "0123456789abcdef0123456789abcdef01234567"),
         "o/deploy", None),
        (TAG_SAN.replace("refs/tags/v0.3.1", "refs/heads/main"), "o/deploy", "identity mismatch"),
        (TAG_SAN.replace("addiplus/batch-invariance", "a/b"), "o/deploy", "identity mismatch"),
        (TAG_SAN, "someone/else", "signature repository mismatch"),  # signed for another repo
    ],
)  # fmt: skip
def test_identity_regexp_decides_coverage(
    world: World, tmp_path: Path, san: str, repository: str, refused: str | None
) -> None:
    folder = shutil.copytree(world["certs"], tmp_path / "certs")
    (folder / (world["green"].name + ".sigstore.json")).write_text("{}")
    config = tmp_path / "llama-server.sh"
    engine = f"llama-server -m {world['model']} {OK_FLAGS}\n"
    config.write_text(dw.path_line(world["binary"]) + engine)
    cells, verify = load_deploy_cells(config).cells, dw.signed_by(lambda _: (san, repository))
    rest = (*ISSUER, "--repository", "o/deploy", "--offline")
    regexp = dw.policy_from("--cert-identity-regexp", TAG_OR_SHA, *rest)
    assert regexp is not None and regexp.signer.identity_is_regexp
    report = check_cells(config, cells, folder, regexp, verify)
    assert report.passed is (refused is None)
    if refused is None:
        assert "signature verified, signed for o/deploy" in report.checks[0].reason
    else:
        assert [c.kind for c in report.checks] == ["invalid"]
        assert refused in report.checks[0].reason
    # The same pattern as an exact --cert-identity is a literal, not a pattern.
    exact = dw.policy_from("--cert-identity", TAG_OR_SHA, *rest)
    assert exact is not None and not exact.signer.identity_is_regexp
    assert not check_cells(config, cells, folder, exact, verify).passed


@SIGNED_FIXTURE
@pytest.mark.usefixtures("home")
@pytest.mark.parametrize(
    ("identity", "repository", "refused"),
    [
        (("--cert-identity-regexp", RELEASE + r"(refs/tags/v[0-9.]+|[0-9a-f]{40})"),
         "trailofbits/rfc8785.py", None),
        (("--cert-identity-regexp", RELEASE + r"[0-9a-f]{40}"), "trailofbits/rfc8785.py",
         "signature identity mismatch"),
        (("--cert-identity", RELEASE_SAN), None, None),
        (("--cert-identity", RELEASE_SAN), "trailofbits/rfc8785.py", None),
        # The source-repository claim (1.3.6.1.4.1.57264.1.12) refuses another repository.
        (("--cert-identity", RELEASE_SAN), "octo/deploy",
         "signature repository mismatch: signed for source repository "
         "https://github.com/trailofbits/rfc8785.py, expected https://github.com/octo/deploy"),
    ],
)  # fmt: skip
def test_the_policy_reaches_sigstore_on_a_real_bundle(
    identity: tuple[str, ...], repository: str | None, refused: str | None
) -> None:
    where = ("--repository", repository) if repository else ("--any-repository",)
    policy = dw.policy_from(*identity, *ISSUER, *where, "--offline")
    assert policy is not None
    wheel, bundle = dw.SIGSTORE / WHEEL, BUNDLE
    if refused is None:
        verify_bundle(wheel, bundle, policy.signer, policy.trust)
        return
    with pytest.raises(CertInvalid) as error:
        verify_bundle(wheel, bundle, policy.signer, policy.trust)
    assert str(error.value).startswith(refused)
