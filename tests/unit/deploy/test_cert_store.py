"""`check-deploy --store DIR` counts a cert only where it verifies and is signed per the gate's
policy; any other is ignored with a line naming it and never covers (nor fails) a cell (the fake
verifier of tests/support/deploy_world.py, and sigstore on the real public bundle, offline)."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.schema import compute_digest
from batch_invariance.cert.signing import GITHUB_ACTIONS_ISSUER
from batch_invariance.cli import main
from batch_invariance.deploy.cert_store import read_store
from batch_invariance.deploy.deploy_report import check_cells, load_deploy_cells
from batch_invariance.errors import UsageError
from tests.support import deploy_world as dw
from tests.support.deploy_world import CACHE_OFF, MODEL, SIGSTORE, Capsys, World, policy_from

CELL_SAN = "https://github.com/addiplus/batch-invariance/.github/workflows/cell.yml@refs/tags/v0"
OTHER_SAN = "https://github.com/someone/else/.github/workflows/cell.yml@refs/tags/v0"
REPOSITORY = "octo/deploy"
#: N=8 at 1024 per slot: a cell the world's certs (N=4) do not cover.
RAISED = f"-c 8192 -np 8 -ub 1 {CACHE_OFF}"
WHEEL = "rfc8785-0.1.2-py3-none-any.whl"
POLICY = ["--cert-identity-regexp", r"^https://github\.com/addiplus/batch-invariance/.*$",
          "--cert-oidc-issuer", GITHUB_ACTIONS_ISSUER, "--repository", REPOSITORY,
          "--offline"]  # fmt: skip
#: The (SAN, repository) each store cert was signed with, and why each but one is ignored.
SIGNED = {
    "good": (CELL_SAN, REPOSITORY, None),
    "foreign": (OTHER_SAN, REPOSITORY, f"signature identity mismatch: signed by {OTHER_SAN}"),
    "other_repo": (CELL_SAN, "a/b", "signature repository mismatch: signed for a/b"),
    "tampered": (CELL_SAN, REPOSITORY, ""),
    "older_rules": (CELL_SAN, REPOSITORY, "written by batch-invariance 0.0.1"),
    "unsigned": (CELL_SAN, REPOSITORY, "not signed (no unsigned.json.sigstore.json beside it)"),
}
VERIFY = dw.signed_by(lambda cert: SIGNED[cert.stem][:2])


def _store_cert(world: World, store: Path, name: str) -> Path:
    """A promotable cert of the raised cell in its own store folder, with a bundle file."""
    folder = store / name
    cert = dw._live_cert(folder, world["model"], parallel=8)
    cert = cert.rename(folder / f"{name}.json")
    (folder / f"{name}.json.sigstore.json").write_text("{}")
    return cert


@pytest.fixture
def store(world: World, tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "store"
    made = {name: _store_cert(world, root, name) for name in SIGNED}
    # One byte of the cert changed after it was written: its digest no longer holds.
    text = made["tampered"].read_text()
    assert "2025-01-02T03:04:05Z" in text
    made["tampered"].write_text(text.replace("2025-01-02T03:04:05Z", "2025-01-02T03:04:06Z"))
    # Written by an older release under its own unversioned rules (its digest holds).
    older = json.loads(made["older_rules"].read_text())
    older.pop("rules_version")
    older["tool_version"] = "0.0.1"
    older["digest"] = compute_digest(older)
    made["older_rules"].write_text(json.dumps(older, indent=2, sort_keys=True) + "\n")
    (made["unsigned"].parent / "unsigned.json.sigstore.json").unlink()
    return {"root": root, **made}


def _deploy(world: World, tmp_path: Path) -> Path:
    config = tmp_path / "llama-server.sh"
    engine = f"llama-server -m {world['model']} {RAISED}"
    line = dw.served(engine, world["certs"], *(shlex.quote(word) for word in POLICY))
    config.write_text(dw.path_line(world["binary"]) + f"exec {line}\n")
    return config


def test_only_a_verified_cert_of_the_gate_identity_is_admitted(store: dict[str, Path]) -> None:
    read = read_store(store["root"], policy_from(*POLICY), VERIFY)
    assert [c.path.name for c in read.admitted] == ["good.json"]
    assert len(read.ignored) == 5
    for name, (_, _, why) in SIGNED.items():
        lines = [line for line in read.ignored if line.startswith(str(store[name]))]
        assert (why is None) is (lines == []) and (why is None or why in lines[0]), (name, lines)
    with pytest.raises(UsageError, match="no such folder"):  # a missing store folder
        read_store(store["root"] / "absent", None)


@pytest.mark.parametrize("keep", ["foreign", "other_repo", "tampered", "older_rules", "unsigned"])
def test_a_refused_store_cert_never_covers_nor_fails_a_cell(
    world: World, store: dict[str, Path], tmp_path: Path, keep: str
) -> None:
    """Alone in the store it leaves the cell missing (not invalid); the good one covers it."""
    only = tmp_path / "only"
    shutil.copytree(store[keep].parent, only / keep)
    policy, verify, config = policy_from(*POLICY), VERIFY, _deploy(world, tmp_path)
    cells = load_deploy_cells(config).cells
    alone = read_store(only, policy, verify)
    assert alone.admitted == () and len(alone.ignored) == 1
    report = check_cells(config, cells, world["certs"], policy, verify, store=alone.admitted)
    assert [c.kind for c in report.checks] == ["missing"]
    shutil.copytree(store["good"].parent, only / "good")
    both = read_store(only, policy, verify)
    report = check_cells(config, cells, world["certs"], policy, verify, store=both.admitted)
    assert [c.kind for c in report.checks] == ["ok"], report.checks[0].reason
    assert report.checks[0].cert == only / "good" / "good.json"


@pytest.mark.skipif(not (SIGSTORE / WHEEL).is_file(), reason="the public sigstore fixture")
@pytest.mark.usefixtures("home")
def test_check_deploy_names_each_ignored_store_file_with_real_sigstore(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    """A store cert beside a real bundle of another file is ignored with its line; the cell stays
    missing, exit 3 (not 5: a stranger's file in the store cannot fail a deploy)."""
    root = tmp_path / "store"
    cert = _store_cert(world, root, "swapped")
    shutil.copyfile(SIGSTORE / f"{WHEEL}.sigstore.json", Path(f"{cert}.sigstore.json"))
    (root / "notes.json").write_text("not json")
    config = _deploy(world, tmp_path)
    args = ["check-deploy", str(config), "--certs", str(world["certs"]), *POLICY]
    assert main([*args, "--store", str(root)]) == exitcodes.NOT_PROMOTABLE
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if "store: ignored" in line]
    assert len(lines) == 2, captured.err
    assert lines[0].startswith(f"check-deploy: store: ignored {root}: notes.json (not a readable")
    assert lines[1].startswith(f"check-deploy: store: ignored {cert}: ")
    assert "signature" in lines[1] or "digest" in lines[1] or "identity" in lines[1]
    assert f"FAIL  {MODEL} ctx=1024 N=8 kv=split" in captured.out
    assert "no cert for" in captured.out and "swapped" not in captured.out
