"""The deploy gate and ``serve`` hold a cert to the sequence lengths it measured: a deploy
serves prompts of any length up to its slot (docs/output-contract.md, "Rule (sequence
length)")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from batch_invariance.core.evidence import GatePolicy
from tests.support.deploy_world import (
    OK_FLAGS,
    Capsys,
    _live_cert,
    assert_decision,
    deploy_files,
    gate,
    served,
)

SHORT = ("{name}: sequences measured up to 92 tokens, but the slot is 1024 tokens",
         "(need >= 768, 3/4 of it)")  # fmt: skip


@pytest.mark.parametrize(
    ("made", "expect", "words"),
    [
        ({}, "raw", ()),  # sequences up to 922 of 1024 tokens
        # Written before the scope was recorded: it still verifies (and is promotable) as
        # written, but covers no deploy, and serve refuses it.
        ({"slot_ctx": None}, "fail", (
            "{name}: sequence length: not recorded (the cert was written before",
            "it covers no 1024-token slot")),
        # 12-token prompts and 80-token answers in a 1024-token slot: UNVERIFIED under the
        # default policy, GREEN (never promotable) under a looser slot fill.
        *(({"short": True, "policy": policy}, "fail", SHORT)
          for policy in (GatePolicy(), GatePolicy(min_slot_fill=0.05))),
    ],
    ids=["fills-the-slot", "not-recorded", "short", "short-loose-policy"],
)  # fmt: skip
def test_a_cert_covers_a_slot_only_where_its_sequences_filled_it(
    tmp_path: Path, capsys: Capsys, made: dict[str, Any], expect: str, words: tuple[str, ...]
) -> None:
    model, binary = deploy_files(tmp_path)
    cert = _live_cert(tmp_path / "certs", model, **made)
    engine, config = f"{binary} -m {model} {OK_FLAGS} -n 16", tmp_path / "deploy.sh"
    config.write_text(f"exec {engine}\n")
    said = [word.format(name=cert.name) for word in words]
    assert_decision(gate(config, cert.parent), capsys.readouterr().out, expect, *said)
    config.write_text(f"exec {served(engine, cert.parent)}\n")
    code = gate(config, cert.parent)
    assert_decision(code, capsys.readouterr().out, "pass" if expect == "raw" else "fail", *said)
    if expect == "raw":
        return
    assert main(["serve", str(cert), "--allow-unsigned"]) == exitcodes.NOT_PROMOTABLE
    err = capsys.readouterr().err
    assert ("92" in err and "1024" in err) if made.get("short") else (
        "does not cover its slot: sequence length: not recorded" in err)  # fmt: skip
    if "slot_ctx" in made:
        assert main(["verify-cert", str(cert)]) == exitcodes.PROMOTABLE
        assert "sequences:  sequence length: not recorded" in capsys.readouterr().out
