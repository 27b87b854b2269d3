"""The deploy gate and ``serve`` hold a cert to the sequence lengths it measured: a deploy
serves prompts of any length up to its slot (docs/output-contract.md, "Rule (sequence
length)")."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from batch_invariance.core.evidence import GatePolicy
from tests.unit.deploy.test_check_deploy import (
    OK_FLAGS,
    _live_cert,
    assert_covered_raw,
    deploy_files,
    served,
)


def _check(root: Path, certs: Path, binary: Path, model: Path, *, serve: bool = False) -> int:
    """check-deploy of the measured server with ``-n 16``, started directly or (``serve``)
    through ``batch-invariance serve``."""
    engine = f"{binary} -m {model} {OK_FLAGS} -n 16"
    config = root / "deploy.sh"
    config.write_text(f"exec {served(engine, certs) if serve else engine}\n")
    return main(["check-deploy", str(config), "--certs", str(certs), "--allow-unsigned"])


def test_a_cert_whose_sequences_fill_the_slot_covers_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, binary = deploy_files(tmp_path)
    _live_cert(tmp_path / "certs", model)  # sequences up to 922 of 1024 tokens
    code = _check(tmp_path, tmp_path / "certs", binary, model, serve=True)
    assert code == exitcodes.PROMOTABLE
    assert "promotable cert" in capsys.readouterr().out
    code = _check(tmp_path, tmp_path / "certs", binary, model)
    assert_covered_raw(code, capsys.readouterr().out)


def test_a_cert_written_before_the_scope_was_recorded_covers_no_slot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, binary = deploy_files(tmp_path)
    old = _live_cert(tmp_path / "certs", model, slot_ctx=None)
    # It still verifies (and is promotable) as written ...
    assert main(["verify-cert", str(old)]) == exitcodes.PROMOTABLE
    assert "sequences:  sequence length: not recorded" in capsys.readouterr().out
    # ... but covers no deploy, and serve refuses it.
    assert _check(tmp_path, tmp_path / "certs", binary, model) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert f"{old.name}: sequence length: not recorded (the cert was written before" in out
    assert "it covers no 1024-token slot" in out
    assert main(["serve", str(old), "--allow-unsigned"]) == exitcodes.NOT_PROMOTABLE
    assert "does not cover its slot: sequence length: not recorded" in capsys.readouterr().err


@pytest.mark.parametrize("policy", [GatePolicy(), GatePolicy(min_slot_fill=0.05)])
def test_a_cert_whose_sequences_stayed_short_is_refused_naming_both_lengths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: GatePolicy
) -> None:
    model, binary = deploy_files(tmp_path)
    # 12-token prompts and 80-token answers in a 1024-token slot: UNVERIFIED under the
    # default policy, GREEN (never promotable) under a looser slot fill.
    short = _live_cert(tmp_path / "certs", model, policy=policy, slot_ctx=1024, short=True)
    assert _check(tmp_path, tmp_path / "certs", binary, model) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert f"{short.name}: sequences measured up to 92 tokens, but the slot is 1024 tokens" in out
    assert "(need >= 768, 3/4 of it)" in out
    assert main(["serve", str(short), "--allow-unsigned"]) == exitcodes.NOT_PROMOTABLE
    err = capsys.readouterr().err
    assert "92" in err and "1024" in err
