"""A cert's evidence must be one consistent record (issue 17 §4): otherwise it is invalid.

Each reproducer writes a cert that re-derives cleanly from its own evidence (the verdict was
built from it) but whose evidence does not hold together, and checks that ``verify-cert``
(the one verification path, which check-deploy and every reader share) exits 5 naming why.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.store import write_cert
from batch_invariance.cli import main
from batch_invariance.core.evidence import CellEvidence, ItemMeta
from tests.support.factories import cert_for, concurrent_pass, green_evidence, replace_pass


def _verify(tmp_path: Path, evidence: CellEvidence, capsys: pytest.CaptureFixture[str]) -> str:
    cert, _ = cert_for(evidence)
    path = write_cert(tmp_path, cert).path
    code = main(["verify-cert", str(path)])
    captured = capsys.readouterr()
    assert code == exitcodes.CERT_INVALID, captured.out
    return captured.err


def test_the_consistent_record_verifies(tmp_path: Path) -> None:
    cert, _ = cert_for(green_evidence())
    assert cert.status == "green"
    assert main(["verify-cert", str(write_cert(tmp_path, cert).path)]) == exitcodes.PROMOTABLE


def test_items_must_be_the_ids_arm_a_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ev = green_evidence()
    ghost = replace(ev, items=(*ev.items, ItemMeta("ghost")))
    err = _verify(tmp_path, ghost, capsys)
    assert "evidence.items are not the ids arm A ran (only in items: ghost" in err
    twice = replace(ev, items=(*ev.items, ev.items[0]))
    assert "evidence.items lists id(s) more than once: t000" in _verify(
        tmp_path / "2", twice, capsys
    )


def test_a_pass_index_recorded_twice_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ev = green_evidence(n_passes=1)
    doubled = replace(ev, c_passes=(*ev.c_passes, ev.c_passes[0]))
    assert "C pass index(es) recorded more than once: 0" in _verify(tmp_path, doubled, capsys)


def test_b_ids_must_be_items(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ev = green_evidence()
    outside = replace(ev, b_ids=("t000", "ghost"))
    err = _verify(tmp_path, outside, capsys)
    assert "evidence.b_ids names id(s) not in evidence.items: ghost" in err


def test_an_id_dispatched_twice_in_a_pass_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ev = green_evidence()
    order = ev.c_passes[0].order
    twice = replace_pass(ev, 0, order=(*order, order[0]))
    err = _verify(tmp_path, twice, capsys)
    assert "C pass 0 dispatched id(s) more than once, so one trial overwrote another: t000" in err
    ids = [m.test_id for m in ev.items]
    stray = replace(ev, c_passes=(*ev.c_passes, concurrent_pass([*ids, "ghost"], 5)))
    assert "C pass 5 has trials for id(s) not in evidence.items: ghost" in _verify(
        tmp_path / "2", stray, capsys
    )


def test_request_keys_on_some_items_only_are_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ev = green_evidence()
    keyed = (replace(ev.items[0], request_key="sha256:" + "0" * 64), *ev.items[1:])
    err = _verify(tmp_path, replace(ev, items=keyed), capsys)
    assert "31 of 32 evidence.items carry no request_key" in err


def test_a_key_written_twice_in_the_json_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same trial written twice keeps the digest (a reader keeps one value), so only the
    text shows it: the cert is invalid, naming the key."""
    cert, _ = cert_for(green_evidence())
    path = write_cert(tmp_path, cert).path
    data = json.loads(path.read_text())
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    first = json.dumps(data["evidence"]["a"]["t000"], sort_keys=True, separators=(",", ":"))
    marker = '"a":{'
    assert text.count(marker) == 1
    path.write_text(text.replace(marker, marker + f'"t000":{first},', 1))
    assert json.loads(path.read_text()) == data  # same content, same digest
    assert main(["verify-cert", str(path)]) == exitcodes.CERT_INVALID
    assert "holds the key 't000' twice" in capsys.readouterr().err
