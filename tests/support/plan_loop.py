"""The gate workflow's plan loop as GitHub runs it: a plan row through the gate workflow's
`with:` and cell.yml's `env:` to the Action's inputs, and what a live run of those inputs
records (tests/unit/deploy/test_plan_cells.py closes the loop; tests/act runs it)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from batch_invariance.action.inputs import live_request, read_inputs
from batch_invariance.core.roles import ServerRole
from batch_invariance.engines.llama_server.env import is_engine_variable
from batch_invariance.host.facts import sha256_file
from batch_invariance.servers.process import ServerProcess
from batch_invariance.service.live import prepare
from batch_invariance.service.target import engine_launcher
from tests.support.paths import REPO

GATE = REPO / ".github" / "workflows" / "gate.yml"
#: A `with:` value cell.yml gets from a plan row (`|| ''`: a null as the empty string).
MATRIX_VALUE = re.compile(r"\$\{\{ matrix\.(\w+)(?: \|\| '')? \}\}")


def _as_github_renders(value: Any) -> str:
    """A matrix value as `${{ matrix.KEY }}` hands it to a string or boolean input."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def cell_inputs(row: dict[str, Any]) -> dict[str, str]:
    """The INPUT_* variables cell.yml's run step gets for ``row``, read from the gate
    workflow's `with:` (each `${{ matrix.KEY }}` replaced by the row's value) through
    cell.yml's own `env:` (each `${{ inputs.NAME }}`)."""
    given = yaml.safe_load(GATE.read_text())["jobs"]["measure"]["with"]
    cell = yaml.safe_load((GATE.parent / "cell.yml").read_text())
    (run,) = [s for s in cell["jobs"]["cell"]["steps"] if s.get("id") == "run"]
    env: dict[str, str] = {}
    for variable, value in run["env"].items():
        found = re.fullmatch(r"\$\{\{ inputs\.([\w-]+) \}\}", str(value))
        passed = None if found is None else given.get(found.group(1))
        key = None if passed is None else MATRIX_VALUE.fullmatch(str(passed))
        if key is not None:
            env[variable] = _as_github_renders(row[key.group(1)])
    return env


def measured_provenance(env: dict[str, str], workspace: Path) -> dict[str, Any]:
    """What a live run of those inputs records: each server's argv and engine variables from
    the launch path run-live takes (prepare, the engine's launcher, the server process), and
    the files it ran, by sha256. The process's own engine variables are cleared first (a
    clean runner); the Action sets the engine-env input's, as its entrypoint does."""
    inputs = read_inputs({**env, "GITHUB_WORKSPACE": str(workspace)})
    with pytest.MonkeyPatch.context() as patch:
        for name in [k for k in os.environ if is_engine_variable(k)]:
            patch.delenv(name)
        for name, value in inputs.engine_env:
            patch.setenv(name, value)
        job = prepare(live_request(inputs, None), create_out_dir=False)
        launcher = engine_launcher(job.target, job.launch, workspace, job.port_policy)
        roles = [(ServerRole.A, 1), (ServerRole.BC, job.parallel)]
        if job.measurement.cache_passes:
            roles.append((ServerRole.CACHE, job.parallel))
        servers = []
        for role, parallel in roles:
            ctx = job.serial_ctx if role == ServerRole.A else job.ctx  # A holds a unified pool
            planned = launcher.planned(parallel, ctx, 1, role)
            process = ServerProcess(
                job.target.engine, planned.command, arm=str(role), parallel=planned.parallel,
                ctx=ctx, port=1, log_dir=workspace,
            )  # fmt: skip
            info = {"engine_env": process.info()["engine_env"]}
            servers.append({"role": str(role), "argv": list(planned.command.argv), "info": info})
    assert job.target.server_bin is not None and job.target.model is not None
    model, binary = job.target.model, job.target.server_bin
    return {
        "driver": "run-live",
        "server_binary": {"path": str(binary), "sha256": sha256_file(binary)},
        "servers": servers,
        "model_file": {
            "path": str(model),
            "name": model.name,
            "sha256": sha256_file(model),
            "size": model.stat().st_size,
        },
        "plan": {"n_predict": job.measurement.n_predict},
    }
