"""The cert's provenance block as a typed model: open (keys it does not name are kept), strict
on the keys it names, and read back byte for byte (the digest holds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from batch_invariance import exitcodes
from batch_invariance.cert.provenance import ModelFileRecord, Provenance
from batch_invariance.cert.schema import canonical_json, compute_digest
from batch_invariance.cert.store import render, write_cert
from batch_invariance.cli import main
from tests.support.factories import cert_for
from tests.support.paths import EXAMPLES

EXAMPLE = EXAMPLES / "certs"


def test_the_example_certs_provenance_reads_back_exactly() -> None:
    for path in sorted(EXAMPLE.glob("*.json")):
        written = json.loads(path.read_text(encoding="utf-8"))["provenance"]
        read = Provenance.from_record(written)
        assert canonical_json(read.record()) == canonical_json(written)
        assert read.server_binary is not None and read.server_binary.sha256
        assert read.bc_server() is not None


def test_a_key_written_null_stays_null_and_an_absent_key_stays_absent() -> None:
    read = Provenance.from_record({"profile": None, "plan": {"n_predict": 8, "req_timeout": 3}})
    assert read.record() == {"profile": None, "plan": {"n_predict": 8, "req_timeout": 3}}
    # An integer where a float could be stays an integer (3.0 would change the digest).
    assert json.dumps(read.record()["plan"]["req_timeout"]) == "3"
    assert read.engine_name == "llama-server" and read.server_entries == ()


def test_keys_it_does_not_name_are_kept_as_written() -> None:
    written = {"model_file": {"sha256": "a" * 64, "vendor": {"x": [1, 2.5]}}, "custom": [True]}
    assert Provenance.from_record(written).record() == written


@pytest.mark.parametrize(
    "bad",
    [
        {"servers": "not a list"},
        {"servers": [{"argv": ["llama-server", 7]}]},
        {"model_file": {"sha256": 5}},
        {"model_file": {"size": True}},
        {"engine": 1},
        {"plan": {"n_predict": "128"}},
        {"servers": [{"info": {"engine_env": {"GGML_X": 1}}}]},
    ],
)
def test_a_named_key_of_the_wrong_type_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Provenance.from_record(bad)


@pytest.mark.parametrize(
    ("where", "value"),
    [("servers", '"x"'), ("model_file", '{"sha256": 5}'), ("schedule", "[1]")],
)
def test_a_cert_whose_provenance_is_unreadable_is_invalid_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, value: str
) -> None:
    """Fail closed: re-sealed with a fresh digest, it is still refused (exit 5, one line)."""
    data = json.loads(render(cert_for()[0]))
    data["provenance"][where] = json.loads(value)
    data["digest"] = compute_digest(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    capsys.readouterr()
    code = main(["verify-cert", str(path)])
    err = capsys.readouterr().err
    assert code == exitcodes.CERT_INVALID, err
    assert err.count("\n") == 1 and f"provenance.{where}" in err and "Traceback" not in err


def test_a_written_cert_reads_its_provenance_by_attribute(tmp_path: Path) -> None:
    cert, _ = cert_for()
    path = write_cert(tmp_path, cert).path
    again = json.loads(path.read_text())["provenance"]
    assert Provenance.from_record(again) == cert.provenance
    assert cert.provenance.model_file == ModelFileRecord.from_record(again["model_file"])


def test_a_key_two_writers_write_is_refused_not_silently_replaced() -> None:
    """The run writes ``chat_template`` from the server's /props; a caller writing it again
    would replace the warning with its own guess."""
    run = Provenance.from_record({"chat_template": {"source": "server_fallback", "warning": "w"}})
    caller = Provenance.from_record({"chat_template": {"source": "unknown", "warning": None}})
    with pytest.raises(ValueError, match="chat_template"):
        caller.merged_over(run)
    merged = Provenance(driver="run-live").merged_over(run)
    assert merged.record() == {**run.record(), "driver": "run-live"}
