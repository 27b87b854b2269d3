"""The composite action (``uses: ./``) run by act, offline, with the real upload step.

One act run of tests/act/workflows/composite.yml (three jobs at once), then each test reads
what act recorded: the job's conclusion, the action's outputs, the job summary, and the
artifact act's artifact server stored (unzipped).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from batch_invariance import exitcodes
from batch_invariance.cert.schema import Cert
from batch_invariance.cert.verify import cert_is_green, verify
from tests.act.act_run import ActRun
from tests.support.factories import load_cert as read_cert

#: The live cell takes about a minute on 2 idle cores; on a host shared with other work it took
#: 19 minutes once (0.39 serial tokens/s against 24 on idle cores). The image is cached by the
#: Docker stage.
TIMEOUT_S = 2400


def _outputs(run: ActRun, job: str) -> dict[str, str]:
    path = run.evidence / f"{job}.outputs.json"
    assert path.is_file(), run.text[-4000:]
    loaded = json.loads(path.read_text())
    assert isinstance(loaded, dict)
    return {str(k): str(v) for k, v in loaded.items()}


def _artifact_name(kind: str, cell_id: str) -> str:
    """The pattern of the artifact name of a step that measured ``cell_id`` (``kind`` cert or
    failed): the cell, the job key (8 hex digits of the step's inputs and job), the attempt."""
    return rf"bi-{kind}-{re.escape(cell_id)}-[0-9a-f]{{8}}-a1"


def _named(run: ActRun, kind: str, cell_id: str) -> str:
    """The one artifact of the run named for ``cell_id``."""
    (name,) = [n for n in run.artifact_names() if re.fullmatch(_artifact_name(kind, cell_id), n)]
    return name


def _cert_from_artifact(run: ActRun, outputs: dict[str, str], tmp_path: Path) -> Cert:
    """The uploaded artifact holds exactly the cert (unsigned under act: no bundle, no
    attestation) and, when the step did not pass, its plan and server logs (debug-paths); the
    cert verifies (schema, digest, re-derived verdict)."""
    name = outputs["artifact"]
    assert re.fullmatch(_artifact_name("cert", outputs["cell-id"]), name), name
    files = run.artifact(name)
    cert_name = Path(outputs["cert-path"]).name
    debug = {Path(p).name for p in outputs.get("debug-paths", "").splitlines()}
    assert set(files) == {cert_name} | debug, files.keys()
    assert outputs["bundle-path"] == "" and outputs["attestation-path"] == ""
    cert_path = tmp_path / cert_name
    cert_path.write_bytes(files[cert_name])
    verify(cert_path).raise_if_invalid()
    return read_cert(cert_path)


def _conclusion(cert: Cert) -> str:
    """The job's conclusion the cert earns with `require: green` (the default)."""
    return "success" if cert_is_green(cert) else "failure"


def _container_exit(run: ActRun, job: str) -> list[str]:
    """act's record of the container step's exit (inside the action: step bi/cell)."""
    return run.exit_statuses(job, "bi", "cell")


def test_live_with_models_outside_the_workspace_measures_the_ladder(
    composite: ActRun, outside_workspace: dict[str, str], tmp_path: Path
) -> None:
    job = "models outside the workspace, live"
    outputs = _outputs(composite, "live")
    assert outputs.get("verdict"), composite.lines(job)[-4000:]
    cert = _cert_from_artifact(composite, outputs, tmp_path)
    assert cert.source == "live"
    assert (outputs["verdict"], outputs["status"]) == (cert.verdict, cert.status)
    assert outputs["cell"].endswith("/256/4") and outputs["divergent-ids"].isdigit()
    # Only server-bin and model were given: the plan named the ladder and measured it.
    assert "batch-invariance: plan: work-set: length ladder, 32 distinct prompts" in (
        composite.lines(job)
    )
    workset = cert.provenance.workset or {}
    assert str(workset.get("source", "")).startswith("length ladder (ctx 256")
    # The embedded default at this size: continuous batching changes answers (RED), or, in a
    # sample where none flipped, the numerics under them: the job's conclusion is the cert's.
    assert composite.job_results(job) == [_conclusion(cert)]
    assert _container_exit(composite, job) == (
        []
        if cert_is_green(cert)
        else [f"exit status {exitcodes.for_status(str(cert.status), promotable=False)}"]
    )
    # The files came through the read-only mounts, after checkout cleaned the workspace, and
    # the cert records them by sha256.
    served, model = cert.provenance.server_binary, cert.provenance.model_file
    assert served is not None and served.path == "/github/server/llama-server"
    server = Path(outside_workspace["BI_ACT_SERVER"]) / "llama-server"
    assert served.sha256 == hashlib.sha256(server.read_bytes()).hexdigest()
    assert model is not None and model.path == f"/github/models/{outside_workspace['BI_ACT_MODEL']}"
    summary = composite.summary(job)
    assert summary.startswith(f"## batch-invariance: {cert.verdict}"), summary[:500]
    if cert.verdict == "RED":
        assert "### Divergent ids (A vs C)" in summary


def test_a_plan_that_cannot_pass_is_refused_before_any_launch(composite: ActRun) -> None:
    job = "a plan that cannot pass"
    outputs = _outputs(composite, "refused")
    assert outputs.get("verdict", "") == "" and outputs.get("cert-path", "") == ""
    assert composite.job_results(job) == ["failure"]
    assert _container_exit(composite, job) == [f"exit status {exitcodes.USAGE}"]
    lines = composite.lines(job)
    assert "refused to launch (no verdict)" in lines
    assert "cannot reach GREEN: answer budget under the length gate: --n-predict 16" in lines
    assert "batch-invariance: arm " not in lines  # nothing was measured
    # No cert, but the refused plan is in the artifact, with its cause.
    plan = f"{outputs['cell-id']}.plan.txt"
    files = composite.artifact(_named(composite, "failed", outputs["cell-id"]))
    assert set(files) == {plan}
    assert b"this plan cannot reach GREEN: answer budget" in files[plan]


def test_exit_4_leaves_the_server_log_in_the_uploaded_artifact(composite: ActRun) -> None:
    job = "a server that cannot start"
    outputs = _outputs(composite, "no-server")
    assert outputs.get("verdict", "") == "" and outputs.get("cert-path", "") == ""
    assert composite.job_results(job) == ["failure"]
    assert _container_exit(composite, job) == [f"exit status {exitcodes.INFRA}"]
    assert re.fullmatch(_artifact_name("failed", outputs["cell-id"]), outputs["artifact"])
    files = composite.artifact(outputs["artifact"])
    plan = f"{outputs['cell-id']}.plan.txt"
    logs = [name for name in files if name.startswith("server-")]
    assert plan in files and logs, files.keys()
    assert b"out-dir: " in files[plan]  # the plan as run-live --dry-run prints it
    assert any(b"this server cannot start" in files[name] for name in logs)


def test_mock_run_is_never_a_pass(composite: ActRun, tmp_path: Path) -> None:
    outputs = _outputs(composite, "mock")
    cert = _cert_from_artifact(composite, outputs, tmp_path)
    assert cert.source == "mock" and outputs["cell"] == "mock/512/4"
    assert (outputs["verdict"], outputs["promotable"]) == ("GREEN", "false")
    assert composite.job_results("/mock") == [_conclusion(cert)] == ["failure"]
    assert _container_exit(composite, "/mock") == [f"exit status {exitcodes.NOT_PROMOTABLE}"]
    summary = composite.summary("/mock")
    assert summary.startswith("## batch-invariance: GREEN") and "Mock run" in summary
    # Every default: the plan named the mock's length ladder, and the run ended with a cert.
    assert "batch-invariance: plan: work-set: length ladder, 32 distinct prompts" in (
        composite.lines("/mock")
    )


def test_signing_without_oidc_refuses_before_running(composite: ActRun) -> None:
    job = "signing without an OIDC identity"
    outputs = _outputs(composite, "no-identity")
    assert outputs.get("verdict", "") == "" and outputs.get("cert-path", "") == ""
    assert composite.job_results(job) == ["failure"]
    assert _container_exit(composite, job) == [f"exit status {exitcodes.USAGE}"]
    assert "signing impossible (no run)" in composite.lines(job)
    assert "signing impossible (no run)" in composite.summary(job)
    assert "batch-invariance: mock cell" not in composite.lines(job), "it ran without a signer"


def test_the_measured_cells_and_the_failures_were_uploaded(composite: ActRun) -> None:
    # The two cells' certs; the refused plan and the exit 4 as bi-failed-...; nothing for the
    # step that refused to run without a signer (no plan, no server: the annotation says it).
    names = {_outputs(composite, job)["artifact"] for job in ("live", "mock", "no-server")}
    names.add(_named(composite, "failed", _outputs(composite, "refused")["cell-id"]))
    assert composite.artifact_names() == names
    assert composite.returncode != 0  # act fails the run when a job fails


def test_act_servers_listen_on_loopback_only(composite: ActRun) -> None:
    messages = [str(e.get("msg", "")) for e in composite.events]
    started = [msg for msg in messages if msg.startswith("Start server")]
    assert started and all("http://127.0.0.1:" in msg for msg in started), started
