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
import os
import re
import shlex
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from batch_invariance import exitcodes
from batch_invariance.action.inputs import live_request, read_inputs
from batch_invariance.cert.store import write_cert
from batch_invariance.cli import build_parser, main
from batch_invariance.commands.cell_options import request_from_args
from batch_invariance.core.evidence import CellSpec
from batch_invariance.core.roles import ServerRole
from batch_invariance.engines.llama_server.engine import kv_label
from batch_invariance.engines.llama_server.env import is_engine_variable
from batch_invariance.servers.process import ServerProcess
from batch_invariance.service.live import prepare
from batch_invariance.service.target import engine_launcher
from tests.support.factories import cert_for, concurrent_pass, green_evidence
from tests.support.fakes_live import dense_meta, write_gguf
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
#: A `with:` value cell.yml gets from a plan row (`|| ''`: a null as the empty string).
MATRIX_VALUE = re.compile(r"\$\{\{ matrix\.(\w+)(?: \|\| '')? \}\}")
#: Raised from the certified N=4 (ctx 1024 per slot, -ub 1): a cell no cert measured.
RAISED = f"-c 8192 -np 8 -ub 1 {CACHE_OFF}"


@pytest.fixture()
def headed(world: dict[str, Path], tmp_path: Path) -> dict[str, Path]:  # noqa: F811
    """The world with a model whose GGUF header reads (a measuring run reads its geometry)."""
    model = tmp_path / "headed" / f"{MODEL}.gguf"
    model.parent.mkdir()
    write_gguf(model, dense_meta())
    return {**world, "model": model}


def _deploy(
    world: dict[str, Path],  # noqa: F811
    folder: Path,
    flags: str,
    script: str = "",
) -> Path:
    config = folder / "llama-server.sh"
    engine = f"llama-server -m {world['model']} {flags} --port 8080"
    body = f"exec {served(engine, world['certs'])}\n"
    config.write_text(path_line(world["binary"]) + script + body)
    return config


def _plan(config: Path, certs: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    args = ["check-deploy", str(config), "--certs", str(certs), "--allow-unsigned", "--plan"]
    assert main(args) == 0
    out = capsys.readouterr().out
    include: list[dict[str, Any]] = json.loads(out)["include"]
    return include


def _as_github_renders(value: Any) -> str:
    """A matrix value as `${{ matrix.KEY }}` hands it to a string or boolean input."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _cell_inputs(row: dict[str, Any]) -> dict[str, str]:
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


def _measured_provenance(env: dict[str, str], workspace: Path) -> dict[str, Any]:
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
            planned = launcher.planned(parallel, job.ctx, 1, role)
            process = ServerProcess(
                job.target.engine, planned.command, arm=str(role), parallel=planned.parallel,
                ctx=job.ctx, port=1, log_dir=workspace,
            )  # fmt: skip
            info = {"engine_env": process.info()["engine_env"]}
            servers.append({"role": str(role), "argv": list(planned.command.argv), "info": info})
    assert job.target.server_bin is not None and job.target.model is not None
    model, binary = job.target.model.read_bytes(), job.target.server_bin.read_bytes()
    return {
        "driver": "run-live",
        "server_binary": {
            "path": str(job.target.server_bin),
            "sha256": hashlib.sha256(binary).hexdigest(),
        },
        "servers": servers,
        "model_file": {
            "path": str(job.target.model),
            "name": job.target.model.name,
            "sha256": hashlib.sha256(model).hexdigest(),
            "size": len(model),
        },
        "plan": {"n_predict": job.measurement.n_predict},
    }


def _measure(
    world: dict[str, Path],  # noqa: F811
    row: dict[str, Any],
    certs: Path,
    tmp_path: Path,
) -> Path:
    """A GREEN cert of the row's cell whose provenance is what measuring the row records (with
    the prompt-cache arm's pass, and its hits, where the row runs that arm)."""
    provenance = _measured_provenance(_cell_inputs(row), tmp_path)
    if not row["cache_arm"]:
        return _live_cert(certs, world["model"], provenance=provenance, parallel=row["parallel"],
                          layout=row["kv_layout"])  # fmt: skip
    green = green_evidence(slot_ctx=row["ctx"])
    prompts = {t: x.prompt_tokens_measured or 0 for t, x in green.a.items()}
    base = concurrent_pass(list(green.a), 0, prompts=prompts)
    trials = {t: replace(x, timings={"cache_n": 40.0}) for t, x in base.trials.items()}
    evidence = replace(green, cache_passes=(replace(base, trials=trials),))
    label = kv_label(row["ctx"], row["parallel"], row["kv_layout"])
    cell = CellSpec(model=MODEL, ctx=row["ctx"], dispatch_n=row["parallel"], kv_label=label,
                    reps=1, is_moe=False)  # fmt: skip
    cert, verdict = cert_for(evidence, cell=cell, extra_provenance=provenance)
    assert cert.status == "green" and cert.prompt_cache is not None, verdict.decision_reasons
    return write_cert(certs, cert).path


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
    headed: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    """The loop, for each kind: the row goes through the gate workflow's `with:` and cell.yml's
    `env:` to the Action's inputs, whose request (the one run-live's flags reader builds from
    the row's run-live line) launches the cell the deploy runs; its cert covers the deploy."""
    flags, script, carried = KINDS[kind]
    certs = tmp_path / "certs"
    shutil.copytree(headed["certs"], certs)
    config = _deploy(headed, tmp_path, flags, script)
    (row,) = _plan(config, certs, capsys)
    assert {k: row[k] for k in carried} == carried and row["cell_yml_refuses"] == ""
    inputs = read_inputs({**_cell_inputs(row), "GITHUB_WORKSPACE": str(tmp_path)})
    assert live_request(inputs, None) == _run_live_request(row["run_live"], inputs.out_dir)
    fresh = _measure(headed, row, certs, tmp_path)
    args = ["check-deploy", str(config), "--certs", str(certs), "--allow-unsigned"]
    assert main(args) == exitcodes.PROMOTABLE, capsys.readouterr().out
    out = capsys.readouterr().out
    assert f"pass  {MODEL} ctx=1024 N=8 kv=split" in out and fresh.name in out
    assert _plan(config, certs, capsys) == []  # the next run measures nothing


def _run_live_request(line: str, out_dir: Path) -> Any:
    """The request run-live's one flags reader builds from the plan's run-live line (its
    variables are the shell's, not flags), with the Action's own choices: its out-dir and
    ending a cell once RED is proven."""
    words = shlex.split(line)
    while "=" in words[0]:
        words.pop(0)
    assert words[:2] == ["batch-invariance", "run-live"]
    args = build_parser().parse_args([*words[1:], "--out-dir", str(out_dir)])
    request = request_from_args(args)
    return replace(request, measurement=replace(request.measurement, stop_on_red=True))


def test_a_plan_that_drops_an_option_measures_a_cell_the_gate_refuses(
    headed: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    certs = tmp_path / "certs"
    shutil.copytree(headed["certs"], certs)
    config = _deploy(headed, tmp_path, f"{RAISED} --temp 0.5")
    (row,) = _plan(config, certs, capsys)
    _measure(headed, {**row, "server_flags": "--ubatch-size\n1"}, certs, tmp_path)
    args = ["check-deploy", str(config), "--certs", str(certs), "--allow-unsigned"]
    assert main(args) == exitcodes.NOT_PROMOTABLE
    assert "--temp 0.5 (measured unset)" in capsys.readouterr().out
    assert [r["id"] for r in _plan(config, certs, capsys)] == [row["id"]]


@pytest.mark.parametrize(
    ("row", "differs"),
    [
        ({"engine_env": ""}, "environment GGML_SCHED_MAX_COPIES=1 (measured (unset))"),
        ({"cache_arm": False, "cache_ram": None}, "measured traffic with the prompt cache off"),
        ({"cache_ram": "2048"}, "--cache-ram 1024 (measured 2048)"),
    ],
)
def test_a_row_that_drops_a_variable_or_the_cache_measures_a_cell_the_gate_refuses(
    headed: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    row: dict[str, Any],
    differs: str,
) -> None:
    certs = tmp_path / "certs"
    shutil.copytree(headed["certs"], certs)
    script = "export GGML_SCHED_MAX_COPIES=1\n"
    config = _deploy(headed, tmp_path, "-c 8192 -np 8 -ub 1 --cache-ram 1024", script)
    (planned,) = _plan(config, certs, capsys)
    _measure(headed, {**planned, **row}, certs, tmp_path)
    args = ["check-deploy", str(config), "--certs", str(certs), "--allow-unsigned"]
    assert main(args) == exitcodes.NOT_PROMOTABLE
    assert differs in capsys.readouterr().out
    assert [r["id"] for r in _plan(config, certs, capsys)] == [planned["id"]]


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (f"-c 8192 -np 8 -kvu -ub 1 {CACHE_OFF}",
         "a unified KV pool of 8192 tokens (the gate needs sequences of 6144 tokens; the "
         "length ladder fills the 1024-token slot)"),
        ("-c 8192 -np 8 -ub 1 --cache-ram -1", "--cache-ram -1 (the cache arm measures 0 MiB"),
        ("-c 8192 -np 8 -ub 1 --cache-reuse 256", "--cache-reuse 256 (the cache arm runs without"),
        (f"-c 8192 -np 8 -ub 1 --no-cont-batching {CACHE_OFF}",
         "--no-cont-batching (run-live refuses it)"),
    ],
)  # fmt: skip
def test_a_cell_no_measuring_run_covers_is_named_and_left_out(
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
    assert "is not in the matrix: no measuring run takes " in captured.err
    assert why in captured.err, captured.err


def test_the_unified_layout_reaches_the_server_and_only_the_pool_is_left_uncovered(
    headed: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """cell.yml takes the unified layout (its kv-layout input), and the cert it measures
    covers the deploy's layout, pool size and flags; what it cannot cover is the pool's
    length (why the plan leaves the cell out)."""
    certs = tmp_path / "certs"
    shutil.copytree(headed["certs"], certs)
    config = _deploy(headed, tmp_path, f"-c 8192 -np 8 -kvu -ub 1 {CACHE_OFF}")
    args = ["check-deploy", str(config), "--certs", str(certs), "--allow-unsigned"]
    assert main([*args, "--json"]) == exitcodes.NOT_PROMOTABLE
    (row,) = json.loads(capsys.readouterr().out)["plan"]
    assert row["kv_layout"] == "unified" and row["cell_yml_refuses"]
    _measure(headed, row, certs, tmp_path)
    assert main(args) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert "the slot is 8192 tokens (need >= 6144, 3/4 of it)" in out, out
    # The layout, the pool's size and the flags are the measured ones: no other difference.
    assert "KV layout" not in out and "pool of" not in out and "(measured" not in out, out


def test_the_gate_workflow_is_one_required_check_fed_by_the_plan() -> None:
    """The called job the ruleset requires has its stable name and runs whatever the jobs
    before it did; every matrix key cell.yml is given is a plan row's key, and every input it
    is given is one cell.yml declares."""
    from dataclasses import fields

    from batch_invariance.deploy.plan_cells import PlanEntry

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
    passed: dict[str, str] = {}
    for name, value in measure["with"].items():
        assert name in declared, name
        found = MATRIX_VALUE.fullmatch(str(value))
        assert found is None or found.group(1) in keys, (name, value)
        if found is not None:
            passed[found.group(1)] = name
    # Every key of a row that says what is measured reaches cell.yml, as the input of its
    # own name (the others name the cell, where the deploy has it, or the plan's own words).
    described = {"id", "label", "origin", "server_bin_as_written", "model_as_written",
                 "server_bin_sha256", "model_sha256", "ctx_total", "run_live",
                 "cell_yml_refuses"}  # fmt: skip
    assert passed == {key: key.replace("_", "-") for key in keys - described}
