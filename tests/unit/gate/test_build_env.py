"""check-deploy compares the variables the deploy's build can read, by the rule a cert records
them (:mod:`batch_invariance.engines.llama_server.linked`): a variable of a runtime the build
does not link is compared on neither side. So a deploy on the host that measured it is not
refused for the ``OPENBLAS_*`` its environment held, even against a cert an older tool wrote
with them, while a build that links OpenBLAS is still held to the measured values.
"""

from __future__ import annotations

import json
from pathlib import Path

from batch_invariance.cert.provenance import Provenance
from batch_invariance.engines.llama_server.env import engine_env
from batch_invariance.engines.llama_server.linked import linked_runtimes
from batch_invariance.gate.cells import cell_of
from batch_invariance.gate.coverage import engine_env_differences
from batch_invariance.gate.server_command import ServerCommand
from tests.support.deploy_world import (
    MODEL,
    OK_FLAGS,
    Capsys,
    World,
    _live_cert,
    _provenance,
    _unsigned,
    deploy_files,
)
from tests.support.elf import llama_build

#: The measuring host's environment: its OpenBLAS tuning and one ggml switch.
HOST = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "1048576", "GGML_SCHED_MAX_COPIES": "4"}
BLAS = {"libggml-blas.so": ("libopenblas.so.0",)}


def _world(root: Path, recorded: dict[str, str], *, blas: bool) -> dict[str, Path]:
    """A build in ``root/bin`` (with ggml's OpenBLAS backend or without) and a cert whose
    servers recorded ``recorded``."""
    root.mkdir()
    model, binary = deploy_files(root)
    llama_build(binary.parent, backends=BLAS if blas else None)
    provenance = _provenance(model, 4, "split")
    for server in provenance["servers"]:
        server["info"] = {"engine_env": recorded}
    certs = root / "certs"
    _live_cert(certs, model, provenance=provenance)
    return {"model": model, "binary": binary, "certs": certs, "root": root}


def _deploy(world: World, **env: str) -> str:
    exports = "".join(f"export {k}={v}\n" for k, v in env.items())
    return f"{exports}llama-server -m {world['model']} {OK_FLAGS}\n"


def _differences(world: World, **env: str) -> tuple[str, ...]:
    """The environment rule's differences for a server the deploy starts with ``env``."""
    (cert,) = world["certs"].glob("*.json")
    provenance = Provenance.from_record(json.loads(cert.read_text())["provenance"])
    argv = ("llama-server", "-m", str(world["model"]), *OK_FLAGS.split())
    command = ServerCommand(origin="deploy.sh:1", argv=argv, env={"PATH": "/usr/bin", **env},
                            search_path=f"{world['binary'].parent}:/usr/bin")  # fmt: skip
    cell = cell_of(command)
    assert cell.binary_path == world["binary"]
    return engine_env_differences(cell.engine_env, provenance, cell.linked)


def test_the_measuring_hosts_openblas_variables_do_not_refuse_its_deploy(
    tmp_path: Path, capsys: Capsys
) -> None:
    world = _world(tmp_path / "w", HOST, blas=False)  # as an older tool recorded it
    # The cert a measurement records now: what this build reads.
    assert engine_env(HOST, linked_runtimes(world["binary"])) == {"GGML_SCHED_MAX_COPIES": "4"}
    # Neither the measuring host's own OpenBLAS variables nor other values count.
    assert _differences(world, **HOST) == ()
    assert _differences(world, GGML_SCHED_MAX_COPIES="4") == ()
    assert _differences(world, GGML_SCHED_MAX_COPIES="4", OPENBLAS_CORETYPE="Zen") == ()
    # ggml's own variables are still compared.
    assert _differences(world) == ("environment GGML_SCHED_MAX_COPIES=(unset) (measured 4)",)
    # And so check-deploy says: the deploy on the measuring host is not refused for them.
    _unsigned(world, tmp_path, _deploy(world, **HOST))
    out = capsys.readouterr().out
    assert f"{MODEL} ctx=1024 N=4" in out and "environment" not in out, out


def test_a_build_that_reads_openblas_is_held_to_the_measured_values(
    tmp_path: Path, capsys: Capsys
) -> None:
    world = _world(tmp_path / "w", HOST, blas=True)
    assert engine_env(HOST, linked_runtimes(world["binary"])) == HOST
    assert _differences(world, **HOST) == ()
    assert _differences(world, GGML_SCHED_MAX_COPIES="4") == (
        "environment OPENBLAS_CORETYPE=(unset) (measured Haswell)",
        "environment OPENBLAS_L2_SIZE=(unset) (measured 1048576)",
    )
    _unsigned(world, tmp_path, _deploy(world, GGML_SCHED_MAX_COPIES="4"))
    assert "environment OPENBLAS_CORETYPE=(unset) (measured Haswell)" in capsys.readouterr().out
