"""The reusable workflow .github/workflows/cell.yml called by a caller with a two-cell
matrix (tests/act/workflows/cell-matrix.yml, the shape of examples/workflows/matrix.yml), run
by act offline: the real actions/checkout of the workflow's own commit, the install into a
venv, the cell in mock mode, the artifact name and the real pinned actions/upload-artifact.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from batch_invariance import exitcodes
from batch_invariance.cert.verify import verify
from tests.act.act_run import ActRun, ActSetup, run_act
from tests.support.factories import load_cert as read_cert
from tests.support.paths import REPO

#: Two venv installs (pip, from the local wheel cache) and two mock cells on 2 cores.
TIMEOUT_S = 900
PARALLELS = ("2", "4")


@pytest.fixture(scope="module")
def matrix(act_setup: ActSetup, tmp_path_factory: pytest.TempPathFactory) -> ActRun:
    run = run_act(act_setup, "act-cell-matrix.yml", tmp_path_factory.mktemp("matrix"), TIMEOUT_S)
    print(f"\nact: cell-matrix.yml in {run.seconds:.1f} s, exit {run.returncode}")
    return run


def _job(parallel: str) -> str:
    # act names a called workflow's job after its `name:` (cell.yml: cell <ctx>x<parallel>).
    return f"cell 2048x{parallel}"


@pytest.mark.parametrize("parallel", PARALLELS)
def test_each_cell_checks_out_its_commit_runs_and_uploads_its_cert(
    matrix: ActRun, act_setup: ActSetup, parallel: str, tmp_path: Path
) -> None:
    job = _job(parallel)
    assert matrix.job_results(job) == ["failure"], matrix.text[-4000:]  # mock never passes
    checkout = matrix.outputs(job, "0")  # the checkout step has no id: act numbers it 0
    assert checkout.get("commit") == act_setup.scratch.source_commit
    run = matrix.outputs(job, "run")
    assert run["verdict"] == "GREEN" and run["promotable"] == "false"
    assert run["cell"] == f"mock/512/{parallel}"
    assert run["cell-id"] == f"mock__ctx512__N{parallel}" and run["bundle-path"] == ""
    assert matrix.exit_statuses(job, "run") == [f"exit status {exitcodes.NOT_PROMOTABLE}"]
    named = matrix.outputs(job, "name")
    assert named["attestation-path"] == ""
    # The cell, the job key (8 hex digits of a hash of the job's inputs), the attempt.
    assert re.fullmatch(rf"bi-cert-{run['cell-id']}-[0-9a-f]{{8}}-a1", named["name"]), named
    files = matrix.artifact(named["name"])
    cert_name = Path(run["cert-path"]).name
    # A mock cell never passes: its plan goes with the cert (debug-paths).
    assert Path(run["debug-paths"]).name == f"{run['cell-id']}.plan.txt"
    assert set(files) == {cert_name, f"{run['cell-id']}.plan.txt"}
    cert_path = tmp_path / cert_name
    cert_path.write_bytes(files[cert_name])
    verify(cert_path).raise_if_invalid()
    cert = read_cert(cert_path)
    assert (cert.source, cert.dispatch_n, cert.verdict) == ("mock", int(parallel), "GREEN")
    assert "Mock run" in matrix.summary(job)


def test_the_matrix_uploaded_one_artifact_per_cell(matrix: ActRun) -> None:
    names = matrix.artifact_names()
    assert len(names) == len(PARALLELS), names
    for parallel in PARALLELS:
        cell = rf"bi-cert-mock__ctx512__N{parallel}-[0-9a-f]{{8}}-a1"
        assert any(re.fullmatch(cell, name) for name in names), names
    assert matrix.returncode != 0


def test_every_workflow_output_comes_from_a_step_output_act_saw_set(matrix: ActRun) -> None:
    """workflow_call outputs -> jobs.cell.outputs -> a step output set in the run. act ends a
    run at the first failed job, so no caller job can read `needs.cell.outputs` here (a real
    runner runs an `if: always()` job after a failed cell); the chain is checked link by link."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "cell.yml").read_text())
    call = workflow[True]["workflow_call"]  # YAML 1.1 reads the key `on` as true
    job_outputs = workflow["jobs"]["cell"]["outputs"]
    reference = re.compile(r"^\$\{\{ (jobs\.cell|steps\.([\w-]+))\.outputs\.([\w-]+) \}\}$")
    for name, spec in call["outputs"].items():
        to_job = reference.match(spec["value"])
        assert to_job and to_job.group(1) == "jobs.cell", (name, spec["value"])
        to_step = reference.match(job_outputs[to_job.group(3)])
        assert to_step and to_step.group(2), (name, job_outputs[to_job.group(3)])
        for parallel in PARALLELS:
            seen = matrix.outputs(_job(parallel), to_step.group(2))
            assert seen.get(to_step.group(3)), (name, parallel, seen)
