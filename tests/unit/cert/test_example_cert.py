"""The example cert in examples/certs/ is a real live cert written by cert_version 3.

It was earned by `batch-invariance demo` on a 2-core CPU host (see examples/certs/README.md):
RED / co_batching with overlap, floor, coverage and numeric evidence met, and logprobs drifting
under co-batching. verify-cert re-derives it (exit 1: a valid RED); tampering with it is caught.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from batch_invariance import __version__, exitcodes
from batch_invariance.cert.parse import version_problem
from batch_invariance.cert.schema import CERT_VERSION, CertHeader
from batch_invariance.cert.verify import verify
from batch_invariance.cli import main
from batch_invariance.core.rules import RULES_VERSION
from tests.support.paths import EXAMPLES

CERT = EXAMPLES / "certs" / "gemma-3-270m-q4_k_m__ctx1024__N4.json"


def test_the_example_cert_verifies_as_a_red(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["verify-cert", str(CERT)])
    out = capsys.readouterr().out
    assert code == exitcodes.RED, out
    assert "verdict re-derived from evidence matches" in out
    # Written before the prompt-cache arm: it still verifies and says what it covers.
    assert "prompt cache: not measured" in out
    data = json.loads(CERT.read_text())
    assert "prompt_cache" not in data
    assert data["cert_version"] == 3
    assert data["source"] == "live" and data["status"] == "failed"
    assert data["divergence_class"] == "co_batching"
    assert data["overlap"]["ok"] and data["completion_floor"]["ok"]
    assert data["cobatch_coverage"]["ok"]
    assert data["provenance"]["driver"] == "demo"
    numerics = data["numerics"]
    assert numerics["evidence"]["ok"]
    assert all(p["rows_with_drift"] > 0 for p in numerics["AC"]["per_pass"])


def test_a_tampered_example_cert_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(CERT.read_text())
    data["status"] = "green"
    data["verdict"] = "GREEN"
    bad = tmp_path / CERT.name
    bad.write_text(json.dumps(data, sort_keys=True))
    assert main(["verify-cert", str(bad)]) == exitcodes.CERT_INVALID


def test_example_cert_holds_real_answers_from_the_completions_endpoint() -> None:
    """The demo asks the base model for raw completions: no chat template, so no ChatML
    fallback echoes (``<|im_start|>``) in any recorded answer."""
    data = json.loads(CERT.read_text())
    assert data["provenance"]["request_template"]["endpoint"] == "completions"
    assert data["provenance"]["chat_template"]["source"] == "not_used"
    evidence = data["evidence"]
    arms = [evidence["a"], evidence["b"], *(p["trials"] for p in evidence["c_passes"])]
    excerpts = [t["completion_excerpt"] for arm in arms for t in arm.values()]
    # B ran on the ids that diverged (all 32 when the cert names none).
    n_b = len(evidence.get("b_ids") or evidence["a"])
    assert len(evidence["b"]) == n_b
    assert len(excerpts) == 32 * (1 + len(evidence["c_passes"])) + n_b
    assert not [e for e in excerpts if "<|im_" in e or not e.strip()]


SCOPE = EXAMPLES / "certs" / "scope"


def test_the_old_example_says_its_sequence_length_was_not_recorded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["verify-cert", str(CERT)])
    assert "sequences:  sequence length: not recorded" in capsys.readouterr().out
    assert "sequence_scope" not in json.loads(CERT.read_text())


def test_the_ladder_certs_hold_the_measured_scope(capsys: pytest.CaptureFixture[str]) -> None:
    """-ub 1 on the embedded pair: GREEN over a 256-token slot, RED over a 1024-token slot
    with drift from position 257 on (examples/certs/README.md)."""
    green = SCOPE / "gemma-3-270m-q4_k_m__ctx256__N4.json"
    assert main(["verify-cert", str(green)]) == exitcodes.PROMOTABLE
    assert "sequences:  over sequences up to 236 of the slot's 256 tokens" in (
        capsys.readouterr().out
    )
    red = SCOPE / "gemma-3-270m-q4_k_m__ctx1024__N4.json"
    assert main(["verify-cert", str(red)]) == exitcodes.RED
    capsys.readouterr()
    scope = json.loads(red.read_text())["sequence_scope"]
    assert (scope["first_drift_position"], scope["bitwise_equal_up_to"]) == (257, 256)
    assert [b["rows_with_drift"] for b in scope["bands"]] == [0, 16, 16, 16]
    assert scope["longest"] >= scope["required"] == 768


#: Every cert this repository ships; the README's tour verifies one of them.
SHIPPED = sorted((EXAMPLES / "certs").rglob("*.json"))
#: The next patch release of this version.
NEXT_PATCH = re.sub(r"(\d+)$", lambda m: str(int(m.group(1)) + 1), __version__)


@pytest.mark.parametrize("shipped", SHIPPED, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_every_shipped_cert_verifies_under_the_next_patch_release(shipped: Path) -> None:
    """The showcase must not die at the next release: a shipped cert records the rules it was
    judged by, so a release of the same rules re-derives it (the whole verification, as the
    release ``NEXT_PATCH`` would run it; tests/unit/cert/test_bumped_release.py runs a real
    installed copy of that release on them)."""
    assert __version__ != NEXT_PATCH
    data = json.loads(shipped.read_text(encoding="utf-8"))
    assert data.get("rules_version") == RULES_VERSION, f"{shipped}: re-derive it (README.md)"
    for release in (__version__, NEXT_PATCH):
        verification = verify(shipped, release=release)
        assert verification.valid, verification.problems
        assert verification.status == data["status"]


def test_a_cert_without_rules_is_refused_by_the_next_patch_release_without_a_pip_line() -> None:
    """What the shipped certs said before they recorded their rules: refused by the next
    release, with the way to re-verify and no ``pip install`` of a release that may never
    have been published (0.1.0 was not)."""
    header = CertHeader(CERT_VERSION, __version__, None)
    assert version_problem("c", header) is None  # this release wrote it: its rules
    problem = version_problem("c", header, release=NEXT_PATCH)
    assert problem is not None and "pip install" not in problem
    assert f"unversioned rules of {__version__}" in problem
    assert "re-run the cell with this version" in problem
