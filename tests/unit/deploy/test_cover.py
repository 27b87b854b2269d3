"""What a cert covers in a deploy (issue 17 §4): the server build and the answer-length scope
of an uncapped deploy (the repository a signature was made for: test_check_deploy.py)."""

# ruff: noqa: F811 (the world fixture, imported)
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.provenance import Provenance
from batch_invariance.deploy.deploy_report import check_cells, load_deploy_cells
from tests.support.deploy_world import (  # noqa: F401 (the fixture)
    MODEL,
    OK_FLAGS,
    Capsys,
    World,
    _unsigned,
    assert_covered_raw,
    assert_decision,
    case_fields,
    world,
)

UNCAPPED = "covers answers up to {longest} tokens only: the deploy sets no -n cap"
CASES = [
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
    # An uncapped deploy passes only with the answer length it is covered for printed.
    *(pytest.param(f"exec {{serve}} {{binary}} -m {{m}} {{ok}} {cap}", "pass", (UNCAPPED,),
                   id=f"uncapped{cap}") for cap in ("", "-n -1", "--n-predict -1")),
    *(pytest.param(f"{{binary}} -m {{m}} {{ok}} {cap}", "raw", (), id=f"uncapped-raw{cap}")
      for cap in ("", "-n -1", "--n-predict -1")),
]  # fmt: skip


@pytest.mark.parametrize(("body", "expect", "words"), CASES)
def test_what_a_cert_covers(
    world: World, tmp_path: Path, capsys: Capsys, body: str, expect: str, words: tuple[str, ...]
) -> None:
    fields = case_fields(world, tmp_path)
    code = _unsigned(world, tmp_path, body.format(**fields) + "\n")
    out = capsys.readouterr().out
    assert_decision(code, out, expect, *(w.format(**fields) for w in words))
    if UNCAPPED in words:  # on the cell's line, and in the summary
        assert out.splitlines()[0].endswith(UNCAPPED.format(**fields))


def test_a_container_or_a_registry_names_no_binary_here(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    (tmp_path / "models").symlink_to(world["model"].parent)
    compose = (
        "services:\n  llm:\n    image: ghcr.io/ggml-org/llama.cpp:server\n"
        f"    volumes: ['./models:/models']\n    command: -m /models/{MODEL}.gguf {OK_FLAGS}\n"
    )
    assert _unsigned(world, tmp_path, compose, name="compose.yml") == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert "runs inside the container image ghcr.io/ggml-org/llama.cpp:server" in out
    # --server-binary names the file the image runs: then the build is checked, and the cell
    # is covered (the image starts llama-server directly: never a pass, issue 40).
    flag = ("--server-binary", str(world["binary"]))
    code = _unsigned(world, tmp_path, compose, *flag, name="compose.yml")
    assert_covered_raw(code, capsys.readouterr().out)
    config = tmp_path / "compose.yml"
    cells = load_deploy_cells(config).cells
    (check,) = check_cells(
        config, cells, world["certs"], None, server_binary=world["binary"]
    ).checks
    assert check.ok and f"build by sha256 of {world['binary']} (--server-binary)" in check.reason


def test_a_cert_that_records_no_build_covers_no_deploy(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    from batch_invariance.cert.advice import engine_advice
    from batch_invariance.cert.build import rederive
    from batch_invariance.cert.parse import parse_cert
    from batch_invariance.cert.store import write_cert

    cert = parse_cert(world["green"].read_text())
    provenance: dict[str, Any] = cert.provenance.record()
    del provenance["server_binary"]
    folder = tmp_path / "certs"
    cert = replace(cert, provenance=Provenance.from_record(provenance))
    write_cert(folder, rederive(cert, engine_advice))
    body = f"{world['binary']} -m {world['model']} {OK_FLAGS}\n"
    assert _unsigned(world, tmp_path, body, certs=folder) == exitcodes.NOT_PROMOTABLE
    assert "the cert records no server binary sha256 (build unknown)" in capsys.readouterr().out


def test_a_cert_that_records_no_answer_length_covers_no_cap_and_no_fixed_n(world: World) -> None:
    from batch_invariance.engines.llama_server.flags import read_flags
    from batch_invariance.gate.cells import cell_of
    from batch_invariance.gate.certs import CertFile
    from batch_invariance.gate.coverage import config_differences
    from batch_invariance.gate.identity import identify_model
    from batch_invariance.gate.server_command import ServerCommand

    data = json.loads(world["green"].read_text())
    argv = data["provenance"]["servers"][1]["argv"]
    bare = CertFile(world["green"], Provenance(), None, True, None, MODEL, 1024, 4,
                    read_flags(argv))  # fmt: skip
    m = str(world["model"])
    uncapped = "no -n cap: the cert records no measured answer length to scope a pass to"
    fixed = "-n 8: the cert records no measured answer length"
    for cap, named in [((), uncapped), (("-n", "-1"), uncapped), (("-n", "8"), fixed)]:
        cell = cell_of(ServerCommand("x", ("llama-server", "-m", m, *OK_FLAGS.split(), *cap), {}))
        diffs = config_differences(cell, bare, identify_model(cell.model_path, cell.model))
        assert named in diffs
