"""The reusable gate workflow (.github/workflows/gate.yml), called on a pull_request event
(tests/act/workflows/gate-pr.yml), run by act offline on the embedded pair, four times in a
row over one cert store (a local bare git repository, as `batch-invariance-certs` would be):

1. the deploy's cell (256 per slot, N 2) has a cert in the store: the plan is empty, nothing
   is measured, the gate passes;
2. the pull request raises `-np` to 4 with `-ub 1` (one token per micro-batch: co-batched
   logprobs are bitwise equal within 256 positions on this pair): the plan names that cell,
   cell.yml measures it live with exactly the plan's row, GREEN; the store job downloads the
   cert (actions/download-artifact) and pushes it to the store; the gate passes on it;
3. the pull request raises `-np` to 8 with the default flags: measured RED; the measure job
   still succeeds (gate.yml asks cell.yml for `require: cert`: the gate is the one verdict), the
   cert is stored, and the gate fails naming the cell, with the changed answers in its summary;
4. the GREEN pull request again: its cert is in the store, nothing is measured, the gate passes.

The live measurements start a llama-server: those runs hold the shared lock (/tmp/bi-live.lock).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batch_invariance.provision.embedded import provision
from tests.act.act_run import ActEvent, ActRun, ActSetup, run_act
from tests.act.scratch import ORIGIN
from tests.support.deploy_world import _live_cert
from tests.support.paths import REPO
from tests.support.plan_loop import measured_provenance

#: Plan, gate, store and two venv installs; with a live cell on 2 loaded cores.
TIMEOUT_S = 2400
GATE_JOB = "batch-invariance gate"
CACHE_OFF = "--no-cache-prompt --cache-ram 0"
#: 256 tokens per slot, short answers (the plan measures a longer budget): the smallest cells.
UNCHANGED = f"-c 512 -np 2 -n 16 {CACHE_OFF}"
GREEN = f"-c 1024 -np 4 -ub 1 -n 16 {CACHE_OFF}"
RED = f"-c 2048 -np 8 -n 16 {CACHE_OFF}"
LIVE_LOCK = Path("/tmp/bi-live.lock")


def _run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=900, **kw)


@pytest.fixture(scope="module")
def gate(act_setup: ActSetup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The launcher the deploy's serve line names (this source in a venv), the embedded pair,
    the bare store and the pull-request event."""
    root = tmp_path_factory.mktemp("gate")
    pair = provision()  # reuses the cache the suite filled
    tool = root / "tool"
    _run([sys.executable, "-m", "venv", str(tool)])
    _run([str(tool / "bin" / "python"), "-m", "pip", "install", "--quiet",
          str(act_setup.scratch.repo)])  # fmt: skip
    store = root / "store.git"
    _run(["git", "init", "--quiet", "--bare", str(store)])
    (root / "serve-certs").mkdir()
    event = root / "event.json"
    event.write_text(json.dumps({"pull_request": {
        "number": 41, "head": {"ref": "raise-np"}, "base": {"ref": "main"}}}))  # fmt: skip
    yield {
        "root": root, "launcher": tool / "bin" / "batch-invariance", "pair": pair,
        "store": store, "event": event, "serve_certs": root / "serve-certs",
    }  # fmt: skip


def _store_env(gate: dict[str, Any]) -> dict[str, str]:
    return {**os.environ, "STORE_URL": f"file://{gate['store']}", "GITHUB_REPOSITORY": ORIGIN}


def _store_push(gate: dict[str, Any], fresh: Path, name: str) -> str:
    """What the store job does: fetch the branch, add the certs under ``fresh``, push."""
    clone = gate["root"] / f"clone-{name}"
    script = str(REPO / "action" / "cert-store.sh")
    env = _store_env(gate)
    fetched = _run([script, "fetch", str(clone)], env=env).stdout
    return fetched + _run([script, "push", str(clone), str(fresh)], env=env).stdout


def _deploy(act_setup: ActSetup, gate: dict[str, Any], flags: str) -> None:
    pair = gate["pair"]
    config = act_setup.scratch.repo / "deploy" / "llama-server.sh"
    config.parent.mkdir(exist_ok=True)
    config.write_text(
        f"#!/bin/sh\nexec {gate['launcher']} serve --certs {gate['serve_certs']} "
        f"--allow-unsigned -- {pair.server_bin} -m {pair.model} {flags}\n"
    )


def _act(act_setup: ActSetup, gate: dict[str, Any], name: str) -> ActRun:
    event = ActEvent("pull_request", gate["event"], {"BI_ACT_LAUNCHER": str(gate["launcher"])})
    out = gate["root"] / name
    run = run_act(act_setup, "act-gate-pr.yml", out, TIMEOUT_S,
                  {"STORE_URL": f"file://{gate['store']}"}, event)  # fmt: skip
    print(f"\nact: gate-pr.yml ({name}) in {run.seconds:.1f} s, exit {run.returncode}")
    for job, seconds in run.job_seconds().items():
        print(f"  {job.split('/')[-1]:<24} {seconds:6.0f} s")
    return run


def _cell_jobs(run: ActRun) -> set[str]:
    return {str(e["job"]).strip() for e in run.events if "cell " in str(e.get("job", ""))}


@pytest.fixture(scope="module")
def seeded(act_setup: ActSetup, gate: dict[str, Any]) -> str:
    """The store holds a promotable cert of the unchanged deploy's cell (256 per slot, N 2):
    its provenance is what measuring that cell's plan row records (tests/unit/deploy/
    test_plan_cells.py closes that loop), over the real embedded pair."""
    pair = gate["pair"]
    env = {"INPUT_SERVER_BIN": str(pair.server_bin), "INPUT_MODEL": str(pair.model),
           "INPUT_CTX": "256", "INPUT_PARALLEL": "2", "INPUT_N_PREDICT": "128"}  # fmt: skip
    provenance = measured_provenance(env, gate["root"])
    fresh = gate["root"] / "seed"
    _live_cert(fresh, pair.model, provenance=provenance, parallel=2, ctx=256, slot_ctx=256)
    return _store_push(gate, fresh, "seed")


@pytest.fixture(scope="module")
def unchanged(act_setup: ActSetup, gate: dict[str, Any], seeded: str) -> ActRun:
    assert "pushed 1 cert(s)" in seeded, seeded
    _deploy(act_setup, gate, UNCHANGED)
    return _act(act_setup, gate, "unchanged")


def _measured(act_setup: ActSetup, gate: dict[str, Any], flags: str, name: str) -> ActRun:
    _deploy(act_setup, gate, flags)
    with LIVE_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the cell starts a real llama-server
        return _act(act_setup, gate, name)


@pytest.fixture(scope="module")
def green(act_setup: ActSetup, gate: dict[str, Any], unchanged: ActRun) -> ActRun:
    return _measured(act_setup, gate, GREEN, "green")


@pytest.fixture(scope="module")
def red(act_setup: ActSetup, gate: dict[str, Any], green: ActRun) -> ActRun:
    return _measured(act_setup, gate, RED, "red")


@pytest.fixture(scope="module")
def again(act_setup: ActSetup, gate: dict[str, Any], red: ActRun) -> ActRun:
    _deploy(act_setup, gate, GREEN)
    return _act(act_setup, gate, "again")


def _label(gate: dict[str, Any], parallel: int) -> str:
    return f"{gate['pair'].model.stem} ctx=256 N={parallel} kv=split"


def _measured_row(run: ActRun, gate: dict[str, Any], parallel: int) -> dict[str, Any]:
    """The plan's one row, checked against the deploy; the cell job that measured it."""
    assert run.job_results("plan") == ["success"], run.text[-4000:]
    plan = run.outputs("plan", "plan")
    assert plan["count"] == "1", plan
    (row,) = json.loads(plan["matrix"])["include"]
    pair = gate["pair"]
    # The deploy's -n 16 is covered by a longer measured budget (16 could never be GREEN).
    assert (row["ctx"], row["parallel"], row["n_predict"]) == (256, parallel, 128)
    assert (row["server_bin"], row["model"]) == (str(pair.server_bin), str(pair.model))
    job = f"cell 256x{parallel}"
    assert any(j.endswith(job) for j in _cell_jobs(run)), _cell_jobs(run)
    # require: cert: the measure job passes on any verdict; the gate job decides.
    assert run.job_results(job) == ["success"], run.lines(job)[-4000:]
    outputs = run.outputs(job, "run")
    assert outputs.get("cell") == f"{pair.model.stem}/256/{parallel}", run.lines(job)[-4000:]
    cell = rf"bi-cert-{outputs['cell-id']}-[0-9a-f]{{8}}-a1"  # the job key: a hash of its inputs
    assert any(re.fullmatch(cell, name) for name in run.artifact_names())
    # The store job downloaded that artifact and pushed its cert to the store branch.
    assert run.job_results("store") == ["success"], run.lines("store")[-3000:]
    assert "cert store: pushed 1 cert(s)" in run.lines("store"), run.lines("store")[-3000:]
    return {**row, **outputs}


def test_an_unchanged_deploy_with_its_cert_in_the_store_passes_measuring_nothing(
    unchanged: ActRun,
) -> None:
    assert unchanged.job_results("plan") == ["success"], unchanged.text[-4000:]
    assert unchanged.outputs("plan", "plan")["count"] == "0"
    assert _cell_jobs(unchanged) == set()
    assert unchanged.job_results("store") == []  # skipped: nothing was measured
    assert unchanged.job_results(GATE_JOB) == ["success"], unchanged.lines(GATE_JOB)[-3000:]
    assert "check-deploy: PASS: 1 batched cell(s) certified" in unchanged.lines(GATE_JOB)
    assert unchanged.returncode == 0


def test_a_raised_np_to_a_green_cell_is_measured_stored_and_passes_in_one_run(
    green: ActRun, gate: dict[str, Any]
) -> None:
    measured = _measured_row(green, gate, 4)
    assert measured["server_flags"].split() == ["--ubatch-size", "1"], measured["server_flags"]
    assert (measured["verdict"], measured["promotable"]) == ("GREEN", "true"), measured
    lines = green.lines(GATE_JOB)
    assert green.job_results(GATE_JOB) == ["success"], lines[-3000:]
    assert "check-deploy: PASS: 1 batched cell(s) certified" in lines, lines[-3000:]
    assert green.returncode == 0


def test_a_raised_np_to_a_red_cell_fails_the_check_naming_the_cell_and_its_answers(
    red: ActRun, gate: dict[str, Any]
) -> None:
    measured = _measured_row(red, gate, 8)
    assert measured["verdict"] == "RED", measured
    lines = red.lines(GATE_JOB)
    assert red.job_results(GATE_JOB) == ["failure"], lines[-3000:]
    assert f"FAIL  {_label(gate, 8)}" in lines and "is not promotable" in lines, lines[-3000:]
    # The summary adds the refused cert's report: the answers that changed.
    summary = red.summary(GATE_JOB)
    assert "## batch-invariance report" in summary and "**RED**" in summary, summary
    assert red.returncode != 0


def test_the_next_run_finds_the_stored_green_cert_and_measures_nothing(
    again: ActRun, gate: dict[str, Any]
) -> None:
    assert again.outputs("plan", "plan")["count"] == "0", again.text[-4000:]
    assert _cell_jobs(again) == set()
    assert again.job_results("store") == []
    lines = again.lines(GATE_JOB)
    assert again.job_results(GATE_JOB) == ["success"], lines[-3000:]
    assert "check-deploy: PASS: 1 batched cell(s) certified" in lines, lines[-3000:]
