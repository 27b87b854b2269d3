"""What a cert covers in a deploy (issue 17 §4): the build where no binary is here or none is
recorded, and the answer length a cert without one covers (the rest: test_check_deploy.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.cert.advice import engine_advice
from batch_invariance.cert.build import rederive
from batch_invariance.cert.parse import parse_cert
from batch_invariance.cert.provenance import Provenance
from batch_invariance.cert.store import write_cert
from batch_invariance.deploy.deploy_report import check_cells, load_deploy_cells
from batch_invariance.engines.llama_server.flags import read_flags
from batch_invariance.gate.cells import cell_of
from batch_invariance.gate.certs import CertFile
from batch_invariance.gate.coverage import config_differences
from batch_invariance.gate.identity import identify_model
from batch_invariance.gate.server_command import ServerCommand
from tests.support import deploy_world as dw
from tests.support.deploy_world import MODEL, OK_FLAGS, Capsys, World, _unsigned


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
    binary, config = world["binary"], tmp_path / "compose.yml"
    code = _unsigned(world, tmp_path, compose, "--server-binary", str(binary), name="compose.yml")
    dw.assert_covered_raw(code, capsys.readouterr().out)
    cells = load_deploy_cells(config).cells
    (check,) = check_cells(config, cells, world["certs"], None, server_binary=binary).checks
    assert check.ok and f"build by sha256 of {binary} (--server-binary)" in check.reason


def test_a_cert_that_records_no_build_covers_no_deploy(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    cert = parse_cert(world["green"].read_text())
    provenance: dict[str, Any] = cert.provenance.record()
    del provenance["server_binary"]
    cert = replace(cert, provenance=Provenance.from_record(provenance))
    write_cert(tmp_path / "certs", rederive(cert, engine_advice))
    body = f"{world['binary']} -m {world['model']} {OK_FLAGS}\n"
    assert _unsigned(world, tmp_path, body, certs=tmp_path / "certs") == exitcodes.NOT_PROMOTABLE
    assert "the cert records no server binary sha256 (build unknown)" in capsys.readouterr().out


def test_a_cert_that_records_no_answer_length_covers_no_cap_and_no_fixed_n(world: World) -> None:
    flags = read_flags(json.loads(world["green"].read_text())["provenance"]["servers"][1]["argv"])
    bare = CertFile(world["green"], Provenance(), None, True, None, MODEL, 1024, 4, flags)
    uncapped = "no -n cap: the cert records no measured answer length to scope a pass to"
    fixed = "-n 8: the cert records no measured answer length"
    for cap, named in [((), uncapped), (("-n", "-1"), uncapped), (("-n", "8"), fixed)]:
        argv = ["llama-server", "-m", str(world["model"]), *OK_FLAGS.split(), *cap]
        cell = cell_of(ServerCommand("x", tuple(argv), {}))
        assert named in config_differences(cell, bare, identify_model(cell.model_path, cell.model))
