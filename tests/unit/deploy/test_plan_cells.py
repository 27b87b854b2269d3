"""`check-deploy --plan`: the run that measures each cell no cert covers, as a GitHub Actions
matrix whose rows the gate workflow hands to cell.yml, closed into a loop: the row, read as
the gate workflow's `with:` reads it, becomes the Action's inputs, those the live request,
that the engine's real launch command; a cert that measured exactly that command covers the
deploy, and the same deploy's next plan is empty. A row that leaves out an output-changing
option measures a cell the gate refuses.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from batch_invariance import exitcodes
from batch_invariance.action.inputs import INPUT_DEFAULTS, live_request, read_inputs
from batch_invariance.cli import main
from batch_invariance.engines.base import LaunchRequest
from batch_invariance.engines.llama_server.engine import LlamaServerEngine
from tests.support.paths import REPO
from tests.unit.deploy.test_check_deploy import (  # noqa: F401 (the fixture)
    CACHE_OFF,
    MODEL,
    _live_cert,
    path_line,
    served,
    world,
)

GATE = REPO / ".github" / "workflows" / "gate.yml"
#: Raised from the certified N=4 (ctx 1024 per slot, -ub 1): a cell no cert measured.
RAISED = f"-c 8192 -np 8 -ub 1 {CACHE_OFF}"


def _deploy(world: dict[str, Path], folder: Path, flags: str) -> Path:  # noqa: F811
    config = folder / "llama-server.sh"
    engine = f"llama-server -m {world['model']} {flags} --port 8080"
    config.write_text(path_line(world["binary"]) + f"exec {served(engine, world['certs'])}\n")
    return config


def _plan(config: Path, certs: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    args = ["check-deploy", str(config), "--certs", str(certs), "--allow-unsigned", "--plan"]
    assert main(args) == 0
    out = capsys.readouterr().out
    include: list[dict[str, Any]] = json.loads(out)["include"]
    return include


def _cell_inputs(row: dict[str, Any]) -> dict[str, str]:
    """The INPUT_* variables cell.yml's run step gets for ``row``, read from the gate
    workflow's `with:` (each `${{ matrix.KEY }}` replaced by the row's value)."""
    workflow = yaml.safe_load(GATE.read_text())
    given = workflow["jobs"]["measure"]["with"]
    env: dict[str, str] = {}
    for name, value in given.items():
        found = re.fullmatch(r"\$\{\{ matrix\.(\w+) \}\}", str(value))
        if found is None or name not in INPUT_DEFAULTS:
            continue
        env["INPUT_" + name.upper().replace("-", "_")] = str(row[found.group(1)])
    return env


def _measured_provenance(env: dict[str, str], workspace: Path) -> dict[str, Any]:
    """What a live run of those inputs records: the A and B/C servers' argv from the engine's
    own launch command, and the files it ran, by sha256."""
    request = live_request(read_inputs({**env, "GITHUB_WORKSPACE": str(workspace)}), None)
    assert request.server_bin is not None and request.model is not None
    assert request.ctx is not None and request.parallel is not None
    engine = LlamaServerEngine()

    def argv(parallel: int) -> list[str]:
        launch = LaunchRequest(
            request.server_bin, request.model, parallel, request.ctx, "127.0.0.1", 1,  # type: ignore[arg-type]
            extra_flags=request.server_flags,
        )  # fmt: skip
        return list(engine.launch_command(launch).argv)

    model, binary = request.model.read_bytes(), request.server_bin.read_bytes()
    return {
        "driver": "run-live",
        "server_binary": {
            "path": str(request.server_bin),
            "sha256": hashlib.sha256(binary).hexdigest(),
        },
        "servers": [{"role": "A", "argv": argv(1)}, {"role": "BC", "argv": argv(request.parallel)}],
        "model_file": {
            "path": str(request.model),
            "name": request.model.name,
            "sha256": hashlib.sha256(model).hexdigest(),
            "size": len(model),
        },
        "plan": {"n_predict": request.measurement.n_predict},
    }


def _measure(
    world: dict[str, Path],  # noqa: F811
    row: dict[str, Any],
    certs: Path,
    tmp_path: Path,
) -> Path:
    """A GREEN cert of the row's cell whose provenance is what measuring the row records."""
    provenance = _measured_provenance(_cell_inputs(row), tmp_path)
    path = _live_cert(certs, world["model"], provenance=provenance, parallel=row["parallel"])
    return path


def test_the_plan_names_everything_a_run_needs(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = _deploy(world, tmp_path, f"{RAISED} --temp 0.5 -fa on --port 9")
    (row,) = _plan(config, world["certs"], capsys)
    model, binary = world["model"], world["binary"]
    assert row["label"] == f"{MODEL} ctx=1024 N=8 kv=split"
    assert row["origin"] == "llama-server.sh:2"
    assert (row["model"], row["model_as_written"]) == (str(model), str(model))
    assert row["model_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert (row["server_bin"], row["server_bin_as_written"]) == (str(binary), "llama-server")
    assert row["server_bin_sha256"] == hashlib.sha256(binary.read_bytes()).hexdigest()
    assert (row["ctx"], row["ctx_total"], row["parallel"]) == (1024, 8192, 8)
    assert (row["kv_layout"], row["engine"], row["n_predict"]) == ("split", "llama-server", 128)
    # Every output-changing option, none of the cell's own, the cache's or the neutral ones.
    assert row["server_flags"].splitlines() == [
        "--flash-attn", "on", "--temp", "0.5", "--ubatch-size", "1",
    ]  # fmt: skip
    assert (row["cache_arm"], row["cell_yml_refuses"], row["engine_env"]) == (False, "", "")
    assert row["run_live"].startswith(f"batch-invariance run-live --server-bin {binary} ")
    assert re.fullmatch(rf"{MODEL}__ctx1024__N8__split__[0-9a-f]{{12}}", row["id"])
    # Stable: the same deploy plans the same id; another option, another id.
    assert _plan(config, world["certs"], capsys)[0]["id"] == row["id"]
    other = _deploy(world, tmp_path, f"{RAISED} --temp 0.6 -fa on")
    assert _plan(other, world["certs"], capsys)[0]["id"] != row["id"]


@pytest.mark.parametrize(("cap", "measured"), [("", 128), ("-n 16", 128), ("-n 512", 512),
                                               ("-n -1", 128)])  # fmt: skip
def test_the_answer_budget_covers_the_deploys_cap(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    cap: str,
    measured: int,
) -> None:
    """A cert covers a cap up to the length it measured; a budget under the default could
    never pass the length gate (the Action refuses such a plan before it launches)."""
    config = _deploy(world, tmp_path, f"{RAISED} {cap}")
    (row,) = _plan(config, world["certs"], capsys)
    assert row["n_predict"] == measured


def test_json_carries_the_same_plan(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = _deploy(world, tmp_path, RAISED)
    (row,) = _plan(config, world["certs"], capsys)
    args = ["check-deploy", str(config), "--certs", str(world["certs"]), "--allow-unsigned"]
    assert main([*args, "--json"]) == exitcodes.NOT_PROMOTABLE
    out = json.loads(capsys.readouterr().out)
    assert out["json_version"] == 2 and out["plan"] == [row]
    assert out["cells"][0]["kind"] == "missing"


def test_a_covered_deploy_plans_nothing(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = _deploy(world, tmp_path, f"-c 4096 -np 4 -ub 1 {CACHE_OFF}")
    assert _plan(config, world["certs"], capsys) == []


def test_measuring_the_plan_covers_the_deploy(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    certs = tmp_path / "certs"
    shutil.copytree(world["certs"], certs)
    config = _deploy(world, tmp_path, f"{RAISED} --temp 0.5")
    (row,) = _plan(config, certs, capsys)
    fresh = _measure(world, row, certs, tmp_path)
    args = ["check-deploy", str(config), "--certs", str(certs), "--allow-unsigned"]
    assert main(args) == exitcodes.PROMOTABLE, capsys.readouterr().out
    out = capsys.readouterr().out
    assert f"pass  {MODEL} ctx=1024 N=8 kv=split" in out and fresh.name in out
    assert _plan(config, certs, capsys) == []  # the next run measures nothing


def test_a_plan_that_drops_an_option_measures_a_cell_the_gate_refuses(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    certs = tmp_path / "certs"
    shutil.copytree(world["certs"], certs)
    config = _deploy(world, tmp_path, f"{RAISED} --temp 0.5")
    (row,) = _plan(config, certs, capsys)
    _measure(world, {**row, "server_flags": "--ubatch-size\n1"}, certs, tmp_path)
    args = ["check-deploy", str(config), "--certs", str(certs), "--allow-unsigned"]
    assert main(args) == exitcodes.NOT_PROMOTABLE
    assert "--temp 0.5 (measured unset)" in capsys.readouterr().out
    assert [r["id"] for r in _plan(config, certs, capsys)] == [row["id"]]


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        ("-c 8192 -np 8 -ub 1", "the prompt cache on (cell.yml runs no cache arm"),
        (f"-c 8192 -np 8 -kvu -ub 1 {CACHE_OFF}", "a unified KV pool"),
    ],
)
def test_a_cell_cell_yml_cannot_measure_is_named_and_left_out(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: str,
    why: str,
) -> None:
    config = _deploy(world, tmp_path, flags)
    args = ["check-deploy", str(config), "--certs", str(world["certs"]), "--allow-unsigned"]
    assert main([*args, "--plan"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"include": []}
    assert "is not in the matrix: cell.yml cannot measure" in captured.err and why in captured.err
    assert "measure it with: batch-invariance run-live " in captured.err


def test_the_gate_workflow_is_one_required_check_fed_by_the_plan() -> None:
    """The called job the ruleset requires has its stable name and runs whatever the jobs
    before it did; every matrix key cell.yml is given is a plan row's key, and every input it
    is given is one cell.yml declares."""
    from dataclasses import fields

    from batch_invariance.deploy.gate.plan_cells import PlanEntry

    workflow = yaml.safe_load(GATE.read_text())
    assert list(workflow[True]) == ["workflow_call"]  # YAML 1.1 reads the key `on` as true
    gate = workflow["jobs"]["gate"]
    assert gate["name"] == "batch-invariance gate"
    assert gate["if"] == "${{ always() }}" and gate["needs"] == ["plan", "measure", "store"]
    measure = workflow["jobs"]["measure"]
    assert measure["if"] == "${{ needs.plan.outputs.count != '0' }}"
    assert measure["uses"] == "addiplus/batch-invariance/.github/workflows/cell.yml@v0"
    cell = yaml.safe_load((GATE.parent / "cell.yml").read_text())
    declared = set(cell[True]["workflow_call"]["inputs"])
    keys = {f.name for f in fields(PlanEntry)}
    for name, value in measure["with"].items():
        assert name in declared, name
        found = re.fullmatch(r"\$\{\{ matrix\.(\w+) \}\}", str(value))
        assert found is None or found.group(1) in keys, (name, value)
