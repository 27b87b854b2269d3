"""The action image for real: built from the Dockerfile, run the way the runner runs it.

Each run goes through ``action/run-container.sh`` (the composite action's container step):
the workspace mounted at /github/workspace (owned by a non-root runner user) and used as the
working directory, INPUT_* variables with their hyphens, GITHUB_OUTPUT and
GITHUB_STEP_SUMMARY in the mounted file-commands folder, HOME at /github/home.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.certificate import cert_is_green
from batch_invariance.cert.verify import verify
from batch_invariance.provision.embedded import provision
from tests.docker.runner_job import Job
from tests.support.factories import load_cert
from tests.unit.action.test_entrypoint import parse_github_output

PROMPTS = [
    "Name the capital of France in one word.",
    "What is 2 + 2? Answer with a number.",
    "Give one color of the sky on a clear day.",
    "Say hello in Spanish.",
]


def _outputs(job: Job) -> dict[str, str]:
    return parse_github_output(job.output.read_text(encoding="utf-8"))


def test_mock_mode_fails_the_job_and_writes_outputs_and_summary(job: Job) -> None:
    proc = job.run(timeout=300, mode="mock", sign="false")
    assert proc.returncode == exitcodes.NOT_PROMOTABLE, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = _outputs(job)
    assert out["verdict"] == "GREEN" and out["promotable"] == "false"
    assert out["cell"] == "mock/512/4" and out["bundle-path"] == ""
    cert = job.workspace / out["cert-path"]
    assert cert.is_file() and not Path(out["cert-path"]).is_absolute()
    assert load_cert(cert).source == "mock"
    summary = job.summary.read_text(encoding="utf-8")
    assert summary.startswith("## batch-invariance: GREEN")
    assert "Mock run" in summary
    assert "::error title=batch-invariance GREEN::" in proc.stdout
    assert job.not_owned_by_runner() == [], "the container left root-owned files"


def test_live_cell_in_the_container_on_the_provisioned_server_and_model(job: Job) -> None:
    pair = provision()  # reuses the cache the suite filled
    # BI_LIVE_SERVER_BIN: another host build to run instead (e.g. one built without -march=native
    # where the provisioned one cannot run on this CPU).
    source_bin = Path(os.environ.get("BI_LIVE_SERVER_BIN") or pair.server_bin)
    # Outside the workspace, as a runner keeps them: mounted read-only by models-dir and
    # server-dir.
    models, builds = job.root / "srv" / "models", job.root / "opt" / "llama"
    models.mkdir(parents=True)
    builds.mkdir(parents=True)
    server = builds / "llama-server"
    model = models / pair.model.name
    shutil.copy2(source_bin, server)
    shutil.copy2(pair.model, model)
    started = time.monotonic()
    # No workset: the length ladder of a 256-token slot, 64-token answers, one pass: the
    # smallest plan that can reach GREEN.
    proc = job.run(
        timeout=900,
        mode="live",
        **{
            "server-dir": str(builds),
            "server-bin": "llama-server",
            "models-dir": str(models),
            "model": model.name,
            "ctx": "256",
            "parallel": "2",
            "gate-passes": "1",
            "reps": "1",
            "n-predict": "64",
            "sign": "false",
        },
    )
    elapsed = time.monotonic() - started
    print(f"\nlive cell in the container: {elapsed:.1f} s, exit {proc.returncode}")
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    out = _outputs(job)
    assert out, proc.stdout[-3000:] + proc.stderr[-3000:]
    cert_path = job.workspace / out["cert-path"]
    report = verify(cert_path).raise_if_invalid()  # schema, digest and re-derived verdict hold
    cert = load_cert(cert_path)
    assert cert.source == "live"
    assert out["verdict"] == cert.verdict and out["status"] == cert.status
    assert out["cell"] == f"{model.stem}/256/2" or out["cell"].endswith("/256/2")
    assert "batch-invariance: plan: work-set: length ladder, 32 distinct prompts" in proc.stdout
    want = (
        exitcodes.PROMOTABLE
        if cert_is_green(cert)
        else exitcodes.for_status(str(cert.status), promotable=False)
    )
    assert proc.returncode == want, (out, proc.stdout[-2000:])
    assert report.status == cert.status
    served = cert.provenance.server_binary
    assert served is not None and served.path == "/github/server/llama-server"
    model_file = cert.provenance.model_file
    assert model_file is not None and model_file.path == f"/github/models/{model.name}"
    assert served.sha256 == hashlib.sha256(server.read_bytes()).hexdigest()
    assert f"## batch-invariance: {cert.verdict}" in job.summary.read_text(encoding="utf-8")
    assert job.not_owned_by_runner() == [], "the container left root-owned files"


def test_preflight_names_a_missing_library_in_one_line(job: Job, tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on the host to build a dynamically linked test binary")
    build = tmp_path / "build"
    build.mkdir()
    (build / "lib.c").write_text("int bi_missing(void) { return 7; }\n")
    (build / "main.c").write_text(
        "int bi_missing(void);\nint main(void) { return bi_missing(); }\n"
    )
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(build / "libbi_missing.so"), str(build / "lib.c")],
        check=True,
    )
    server = job.workspace / "llama-server"
    subprocess.run(
        [cc, "-o", str(server), str(build / "main.c"), f"-L{build}", "-lbi_missing"], check=True
    )
    (job.workspace / "model.gguf").write_bytes(b"GGUF")
    # The runner user's files, as a checkout leaves them (this test runs as root).
    for path in (server, job.workspace / "model.gguf"):
        shutil.chown(path, job.workspace.stat().st_uid, job.workspace.stat().st_gid)
    proc = job.run(
        timeout=300,
        mode="live",
        sign="false",
        **{"server-bin": "llama-server", "model": "model.gguf"},
    )
    assert proc.returncode == exitcodes.USAGE, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stdout.splitlines() if line.startswith("::error")]
    assert len(errors) == 1, proc.stdout
    assert "missing libbi_missing.so" in errors[0]
    assert "-DBUILD_SHARED_LIBS=OFF" in errors[0] and "BASE_IMAGE" in errors[0]
    # No verdict outputs without a run: only the container step's job key (artifact names).
    assert set(_outputs(job)) == {"job-key"}, _outputs(job)
    assert "preflight" in job.summary.read_text(encoding="utf-8")
    assert job.not_owned_by_runner() == []
