"""The reusable gate workflow (.github/workflows/gate.yml), called on a pull_request event
(tests/act/workflows/gate-pr.yml), run by act offline on the embedded pair, three times in a
row over one cert store (a local bare git repository, as `batch-invariance-certs` would be):

1. the deploy's cell (256 per slot, N 4) has a cert in the store: the plan is empty, nothing
   is measured, the gate passes;
2. the pull request raises `-np` to 8: the plan names that cell, and cell.yml measures it live
   on the real llama-server with exactly the plan's row; act ends a run at its first failed
   job, so when the cell is not GREEN (on this CPU pair it never is) the store job is done by
   the test with the same script (action/cert-store.sh push) on the uploaded artifact;
3. the same pull request again: the stored cert claims the cell, so nothing is measured, and
   the gate passes or fails on that measured verdict, naming the cell.

The live measurement starts a llama-server: the run holds the shared lock (/tmp/bi-live.lock).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import zipfile
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

#: Plan, gate and two venv installs; with the live cell of run 2 on 2 loaded cores.
TIMEOUT_S = 2400
GATE_JOB = "batch-invariance gate"
CACHE_OFF = "--no-cache-prompt --cache-ram 0"
#: 256 tokens per slot, short answers: the smallest cell the act stage measures.
UNCHANGED = f"-c 1024 -np 4 -n 16 {CACHE_OFF}"
RAISED = f"-c 2048 -np 8 -n 16 {CACHE_OFF}"
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
    return run


def _cell_jobs(run: ActRun) -> set[str]:
    return {str(e["job"]).strip() for e in run.events if "cell " in str(e.get("job", ""))}


@pytest.fixture(scope="module")
def seeded(act_setup: ActSetup, gate: dict[str, Any]) -> str:
    """The store holds a promotable cert of the unchanged deploy's cell (256 per slot, N 4):
    its provenance is what measuring that cell's plan row records (tests/unit/deploy/
    test_plan_cells.py closes that loop), over the real embedded pair."""
    pair = gate["pair"]
    env = {"INPUT_SERVER_BIN": str(pair.server_bin), "INPUT_MODEL": str(pair.model),
           "INPUT_CTX": "256", "INPUT_PARALLEL": "4", "INPUT_N_PREDICT": "128"}  # fmt: skip
    provenance = measured_provenance(env, gate["root"])
    fresh = gate["root"] / "seed"
    _live_cert(fresh, pair.model, provenance=provenance, parallel=4, ctx=256, slot_ctx=256)
    return _store_push(gate, fresh, "seed")


@pytest.fixture(scope="module")
def unchanged(act_setup: ActSetup, gate: dict[str, Any], seeded: str) -> ActRun:
    assert "pushed 1 cert(s)" in seeded, seeded
    _deploy(act_setup, gate, UNCHANGED)
    return _act(act_setup, gate, "unchanged")


@pytest.fixture(scope="module")
def raised(act_setup: ActSetup, gate: dict[str, Any], unchanged: ActRun) -> ActRun:
    _deploy(act_setup, gate, RAISED)
    with LIVE_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the cell starts a real llama-server
        return _act(act_setup, gate, "raised")


@pytest.fixture(scope="module")
def stored(gate: dict[str, Any], raised: ActRun) -> str:
    """The store job's work on run 2's artifact, where act could not run that job."""
    if raised.job_results("store"):
        return "stored by the store job"
    fresh = gate["root"] / "fresh"
    for name in sorted(n for n in raised.artifact_names() if n.startswith("bi-cert-")):
        (archive,) = raised.artifacts.glob(f"*/{name}/{name}.zip")
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(fresh / name)
    return _store_push(gate, fresh, "raised")


@pytest.fixture(scope="module")
def again(act_setup: ActSetup, gate: dict[str, Any], stored: str) -> ActRun:
    return _act(act_setup, gate, "again")


def test_an_unchanged_deploy_with_its_cert_in_the_store_passes_measuring_nothing(
    unchanged: ActRun,
) -> None:
    assert unchanged.job_results("plan") == ["success"], unchanged.text[-4000:]
    assert unchanged.outputs("plan", "plan")["count"] == "0"
    assert _cell_jobs(unchanged) == set()
    assert unchanged.job_results(GATE_JOB) == ["success"], unchanged.lines(GATE_JOB)[-3000:]
    assert "check-deploy: PASS: 1 batched cell(s) certified" in unchanged.lines(GATE_JOB)
    assert unchanged.returncode == 0


def test_a_raised_np_measures_exactly_the_planned_cell_through_cell_yml(
    raised: ActRun, gate: dict[str, Any]
) -> None:
    assert raised.job_results("plan") == ["success"], raised.text[-4000:]
    plan = raised.outputs("plan", "plan")
    assert plan["count"] == "1"
    (row,) = json.loads(plan["matrix"])["include"]
    pair = gate["pair"]
    # The deploy's -n 16 is covered by a longer measured budget (16 could never be GREEN).
    assert (row["ctx"], row["parallel"], row["n_predict"]) == (256, 8, 128)
    assert (row["server_bin"], row["model"]) == (str(pair.server_bin), str(pair.model))
    assert any(job.endswith("cell 256x8") for job in _cell_jobs(raised)), _cell_jobs(raised)
    run = raised.outputs("cell 256x8", "run")
    assert run.get("cell") == f"{pair.model.stem}/256/8", raised.lines("cell 256x8")[-4000:]
    assert run["verdict"] in {"GREEN", "RED", "AMBER", "UNVERIFIED"}
    cell = rf"bi-cert-{run['cell-id']}-[0-9a-f]{{8}}-a1"  # the job key: a hash of its inputs
    assert any(re.fullmatch(cell, name) for name in raised.artifact_names())


def test_the_next_run_measures_nothing_and_gates_on_the_measured_verdict(
    raised: ActRun, stored: str, again: ActRun, gate: dict[str, Any]
) -> None:
    assert "pushed 1 cert(s)" in stored or stored == "stored by the store job", stored
    assert again.outputs("plan", "plan")["count"] == "0", again.text[-4000:]
    assert _cell_jobs(again) == set()
    verdict = raised.outputs("cell 256x8", "run")["verdict"]
    lines = again.lines(GATE_JOB)
    label = f"{gate['pair'].model.stem} ctx=256 N=8 kv=split"
    if verdict == "GREEN" and raised.outputs("cell 256x8", "run")["promotable"] == "true":
        assert again.job_results(GATE_JOB) == ["success"], lines[-3000:]
    else:
        assert again.job_results(GATE_JOB) == ["failure"], lines[-3000:]
        assert f"FAIL  {label}" in lines and "is not promotable" in lines, lines[-3000:]
        # The summary adds the refused cert's report: the answers that changed.
        summary = again.summary(GATE_JOB)
        assert "## batch-invariance report" in summary and f"**{verdict}**" in summary, summary
