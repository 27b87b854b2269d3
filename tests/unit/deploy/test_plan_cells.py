"""`check-deploy --plan` closed into a loop: the row, as the gate workflow's `with:` reads it, is
the Action's inputs, those the live request, that the launch command; a cert of exactly that
command covers the deploy (the next plan is empty); a row that drops an option does not."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from batch_invariance import exitcodes
from batch_invariance.action.inputs import live_request, read_inputs
from batch_invariance.cli import build_parser
from batch_invariance.commands.cell_options import request_from_args
from batch_invariance.deploy.plan_cells import PlanEntry
from tests.support.deploy_world import CACHE_OFF, MODEL, Capsys, World, _live_cert, gate, served
from tests.support.deploy_world import path_line as path
from tests.support.fakes_live import dense_meta, write_gguf
from tests.support.plan_loop import GATE, MATRIX_VALUE, cell_inputs, measured_provenance

#: Raised from the certified N=4 (ctx 1024 per slot, -ub 1): a cell no cert measured.
RAISED = f"-c 8192 -np 8 -ub 1 {CACHE_OFF}"


@pytest.fixture()
def headed(world: World, tmp_path: Path) -> dict[str, Path]:
    """The world with a model whose GGUF header reads (a measuring run reads its geometry)."""
    model = tmp_path / "headed" / f"{MODEL}.gguf"
    model.parent.mkdir()
    write_gguf(model, dense_meta())
    return {**world, "model": model}


def _deploy(world: World, folder: Path, flags: str, script: str = "") -> Path:
    folder.mkdir(exist_ok=True)
    config = folder / "llama-server.sh"
    engine = f"llama-server -m {world['model']} {flags} --port 8080"
    body = f"exec {served(engine, world['certs'])}\n"
    config.write_text(path(world["binary"]) + script + body)
    return config


def _plan(config: Path, certs: Path, capsys: Capsys) -> list[dict[str, Any]]:
    assert gate(config, certs, "--plan") == 0
    include: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["include"]
    return include


def _measure(
    world: World, row: dict[str, Any], certs: Path, tmp_path: Path, reach: int | None = None
) -> Path:
    """A GREEN cert of the row's cell whose provenance is what measuring the row records."""
    provenance = measured_provenance(cell_inputs(row), tmp_path)
    return _live_cert(certs, world["model"], provenance=provenance, parallel=row["parallel"],
                      layout=row["kv_layout"], cache_arm=row["cache_arm"],
                      reach=reach)  # fmt: skip


def test_the_plan_names_everything_a_run_needs(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    config = _deploy(world, tmp_path, f"{RAISED} --temp 0.5 -fa on --port 9")
    (row,) = _plan(config, world["certs"], capsys)
    model, binary = world["model"], world["binary"]
    expected = {"label": f"{MODEL} ctx=1024 N=8 kv=split", "origin": "llama-server.sh:2",
                "model": str(model), "model_as_written": str(model), "server_bin": str(binary),
                "server_bin_as_written": "llama-server", "ctx": 1024, "ctx_total": 8192,
                "parallel": 8, "kv_layout": "split", "engine": "llama-server", "n_predict": 128,
                "cache_arm": False, "cell_yml_refuses": "", "engine_env": "",
                "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                "server_bin_sha256": hashlib.sha256(binary.read_bytes()).hexdigest()}  # fmt: skip
    assert {k: row[k] for k in expected} == expected
    # Every output-changing option, none of the cell's own, the cache's or the neutral ones.
    assert row["server_flags"].splitlines() == [
        "--flash-attn",
        "on",
        "--temp",
        "0.5",
        "--ubatch-size",
        "1",
    ]
    assert row["run_live"].startswith(f"batch-invariance run-live --server-bin {binary} ")
    assert re.fullmatch(rf"{MODEL}__ctx1024__N8__split__[0-9a-f]{{12}}", row["id"])
    # Stable: the same deploy plans the same id; another option, another id.
    assert _plan(config, world["certs"], capsys)[0]["id"] == row["id"]
    other = _deploy(world, tmp_path / "other", f"{RAISED} --temp 0.6 -fa on")
    assert _plan(other, world["certs"], capsys)[0]["id"] != row["id"]
    # --json carries the same plan beside the cells.
    assert gate(config, world["certs"], "--json") == exitcodes.NOT_PROMOTABLE
    out = json.loads(capsys.readouterr().out)
    assert out["json_version"] == 2 and out["plan"] == [row]
    assert out["cells"][0]["kind"] == "missing"
    # A cert covers a cap up to the length it measured; a budget under the default could never
    # pass the length gate (the Action refuses such a plan before it launches).
    for cap, measured in [("", 128), ("-n 16", 128), ("-n 512", 512), ("-n -1", 128)]:
        config = _deploy(world, tmp_path / f"cap{cap}", f"{RAISED} {cap}")
        assert _plan(config, world["certs"], capsys)[0]["n_predict"] == measured, cap


#: One deploy of each kind of cell the plan emits: the flags, what the script sets before
#: it, and what the row then carries beyond the split cell's.
KINDS: dict[str, tuple[str, str, dict[str, object]]] = {
    "split": (f"{RAISED} --temp 0.5", "", {}),
    "engine-env": (RAISED, "export GGML_SCHED_MAX_COPIES=1\n",
                   {"engine_env": "GGML_SCHED_MAX_COPIES=1"}),
    "cache-arm": ("-c 8192 -np 8 -ub 1", "", {"cache_arm": True, "cache_ram": "8192"}),
    "cache-ram": ("-c 8192 -np 8 -ub 1 --cache-ram 1024", "",
                  {"cache_arm": True, "cache_ram": "1024"}),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_measuring_the_plan_covers_the_deploy(
    headed: World, tmp_path: Path, capsys: Capsys, kind: str
) -> None:
    """The loop, for each kind (the module's docstring); the next plan measures nothing."""
    flags, script, carried = KINDS[kind]
    certs = shutil.copytree(headed["certs"], tmp_path / "certs")
    config = _deploy(headed, tmp_path, flags, script)
    (row,) = _plan(config, certs, capsys)
    assert {k: row[k] for k in carried} == carried and row["cell_yml_refuses"] == ""
    inputs = read_inputs({**cell_inputs(row), "GITHUB_WORKSPACE": str(tmp_path)})
    assert live_request(inputs, None) == _run_live_request(row["run_live"], inputs.out_dir)
    fresh = _measure(headed, row, certs, tmp_path)
    assert gate(config, certs) == exitcodes.PROMOTABLE
    out = capsys.readouterr().out
    assert f"pass  {MODEL} ctx=1024 N=8 kv=split" in out and fresh.name in out, out
    assert _plan(config, certs, capsys) == []


def _run_live_request(line: str, out_dir: Path) -> Any:
    """The request run-live builds from the row's run-live line (its leading variables are the
    shell's), with the Action's own out-dir and ending a cell once RED is proven."""
    words = shlex.split(line)
    while "=" in words[0]:
        words.pop(0)
    assert words[:2] == ["batch-invariance", "run-live"]
    args = build_parser().parse_args([*words[1:], "--out-dir", str(out_dir)])
    request = request_from_args(args)
    return replace(request, measurement=replace(request.measurement, stop_on_red=True))


@pytest.mark.parametrize(
    ("row", "differs"),
    [
        ({"server_flags": "--ubatch-size\n1"}, "--temp 0.5 (measured unset)"),
        ({"engine_env": ""}, "environment GGML_SCHED_MAX_COPIES=1 (measured (unset))"),
        ({"cache_arm": False, "cache_ram": None}, "measured traffic with the prompt cache off"),
        ({"cache_ram": "2048"}, "--cache-ram 1024 (measured 2048)"),
    ],
    ids=["option", "variable", "cache-arm", "cache-ram"],
)
def test_a_row_that_drops_an_option_measures_a_cell_the_gate_refuses(
    headed: World, tmp_path: Path, capsys: Capsys, row: dict[str, Any], differs: str
) -> None:
    certs = shutil.copytree(headed["certs"], tmp_path / "certs")
    script = "export GGML_SCHED_MAX_COPIES=1\n"
    config = _deploy(headed, tmp_path, "-c 8192 -np 8 -ub 1 --cache-ram 1024 --temp 0.5", script)
    (planned,) = _plan(config, certs, capsys)
    _measure(headed, {**planned, **row}, certs, tmp_path)
    assert gate(config, certs) == exitcodes.NOT_PROMOTABLE
    assert differs in capsys.readouterr().out
    assert [r["id"] for r in _plan(config, certs, capsys)] == [planned["id"]]


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        # A pool too small to hold 3/4 of it beside a co-batched companion at the answer
        # budget (128): no ladder can fill it (a unified cell that can be filled is planned).
        (f"-c 1024 -np 2 -kvu -ub 1 {CACHE_OFF}",
         "a unified KV pool: the pool of 1024 tokens (--ctx 512 x N 2) cannot hold sequences "
         "of 3/4 of it (768 tokens) beside short co-batched companions (up to "),
        ("-c 8192 -np 8 -ub 1 --cache-ram -1", "--cache-ram -1 (the cache arm measures 0 MiB"),
        ("-c 8192 -np 8 -ub 1 --cache-reuse 256", "--cache-reuse 256 (the cache arm runs without"),
        (f"-c 8192 -np 8 -ub 1 --no-cont-batching {CACHE_OFF}",
         "--no-cont-batching (run-live refuses it)"),
    ],
)  # fmt: skip
def test_a_cell_no_measuring_run_covers_is_named_and_left_out(
    world: World, tmp_path: Path, capsys: Capsys, flags: str, why: str
) -> None:
    config = _deploy(world, tmp_path, flags)
    assert gate(config, world["certs"], "--plan") == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"include": []} and why in err, err
    assert "is not in the matrix: no measuring run takes " in err


def test_a_unified_cell_is_planned_with_its_layout_and_its_measured_pool_covers_it(
    headed: World, tmp_path: Path, capsys: Capsys
) -> None:
    """Planned with ``kv-layout: unified``: the cert of its ladder's long rungs past 3/4 of the
    pool covers the deploy; one whose sequences stopped at the slot does not."""
    certs = shutil.copytree(headed["certs"], tmp_path / "certs")
    config = _deploy(headed, tmp_path, f"-c 8192 -np 8 -kvu -ub 1 {CACHE_OFF}")
    (row,) = _plan(config, certs, capsys)
    assert (row["kv_layout"], row["cell_yml_refuses"]) == ("unified", "")
    assert (row["ctx"], row["ctx_total"], row["parallel"]) == (1024, 8192, 8)
    assert "--kv-layout unified" in row["run_live"]
    short = _measure(headed, row, certs, tmp_path)
    assert gate(config, certs) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert "the slot is 8192 tokens (need >= 6144, 3/4 of it)" in out, out
    # The layout, the pool's size and the flags are the measured ones: no other difference.
    assert "KV layout" not in out and "pool of" not in out and "(measured" not in out, out
    short.unlink()
    _measure(headed, row, certs, tmp_path, reach=row["ctx_total"])
    assert gate(config, certs) == exitcodes.PROMOTABLE, capsys.readouterr().out


def test_the_gate_workflow_is_one_required_check_fed_by_the_plan() -> None:
    """The required job has its stable name and runs whatever the jobs before it did; every
    matrix key cell.yml is given is a plan row's key, every input one cell.yml declares."""
    workflow = yaml.safe_load(GATE.read_text())
    assert list(workflow[True]) == ["workflow_call"]  # YAML 1.1 reads the key `on` as true
    job = workflow["jobs"]["gate"]
    assert job["name"] == "batch-invariance gate"
    assert job["if"] == "${{ always() }}" and job["needs"] == ["plan", "measure", "store"]
    measure = workflow["jobs"]["measure"]
    assert measure["if"] == "${{ needs.plan.outputs.count != '0' }}"
    assert measure["uses"] == "addiplus/batch-invariance/.github/workflows/cell.yml@v0"
    cell = yaml.safe_load((GATE.parent / "cell.yml").read_text())
    declared = set(cell[True]["workflow_call"]["inputs"])
    keys = {f.name for f in fields(PlanEntry)}
    assert set(measure["with"]) <= declared, measure["with"]
    found = {name: MATRIX_VALUE.fullmatch(str(value)) for name, value in measure["with"].items()}
    passed = {match.group(1): name for name, match in found.items() if match}
    # Every key of a row that says what is measured reaches cell.yml, as the input of its
    # own name (the others name the cell, where the deploy has it, or the plan's own words).
    described = {"id", "label", "origin", "server_bin_as_written", "model_as_written",
                 "server_bin_sha256", "model_sha256", "ctx_total", "run_live",
                 "cell_yml_refuses"}  # fmt: skip
    assert passed == {key: key.replace("_", "-") for key in keys - described}
