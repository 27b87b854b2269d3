"""The Action's entrypoint under a simulated GitHub Actions environment (mock mode).

The entrypoint runs as the runner would run it (``python -m batch_invariance.action`` with
INPUT_* variables, GITHUB_OUTPUT, GITHUB_STEP_SUMMARY, GITHUB_WORKSPACE, GITHUB_ACTIONS=true),
and in-process through :func:`run_action` where a fake signer or a loopback OIDC endpoint is
needed. Mock mode really runs the driver against the in-process mock server.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from batch_invariance import exitcodes
from batch_invariance.action import entrypoint as action
from batch_invariance.action import inputs as action_inputs
from batch_invariance.action import outputs as action_outputs
from batch_invariance.report import render
from tests.support.factories import load_cert
from tests.support.fakes_live import hf_model_files
from tests.support.loopback import serving
from tests.support.paths import REPO

ACTIONS_ISSUER = "https://token.actions.githubusercontent.com"
WORKFLOW_REF = "octo/repo/.github/workflows/cell.yml@refs/heads/main"


def parse_github_output(text: str) -> dict[str, str]:
    """Read $GITHUB_OUTPUT the way the runner does (``k=v`` and ``k<<DELIM`` forms)."""
    values: dict[str, str] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line:
            i += 1
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            body: list[str] = []
            i += 1
            while lines[i] != delimiter:
                body.append(lines[i])
                i += 1
            values[name] = "\n".join(body)
        else:
            name, value = line.split("=", 1)
            values[name] = value
        i += 1
    return values


def actions_env(tmp_path: Path, **inputs: str) -> dict[str, str]:
    """A clean simulated Actions environment with the given inputs (hyphenated names)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    (tmp_path / "github_output").touch()
    (tmp_path / "step_summary").touch()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("INPUT_", "GITHUB_", "ACTIONS_"))
    }
    env.update(
        {
            "GITHUB_ACTIONS": "true",
            "GITHUB_WORKSPACE": str(workspace),
            "GITHUB_OUTPUT": str(tmp_path / "github_output"),
            "GITHUB_STEP_SUMMARY": str(tmp_path / "step_summary"),
            "HOME": str(tmp_path / "home"),
            "NO_PROXY": "127.0.0.1,localhost",
        }
    )
    for name, value in inputs.items():
        env[f"INPUT_{name.upper()}"] = value
    return env


def outputs_of(env: Mapping[str, str]) -> dict[str, str]:
    return parse_github_output(Path(env["GITHUB_OUTPUT"]).read_text(encoding="utf-8"))


def tiny_workset(env: Mapping[str, str]) -> str:
    """A four-prompt work-set in the workspace (its name, as the workset input takes it): for
    a test of what happens around the mock cell, not of its verdict, which the length ladder
    the default measures would take seconds to reach."""
    rows = [{"id": f"t{i}", "prompt": f"What is {i} + {i}?"} for i in range(4)]
    (Path(env["GITHUB_WORKSPACE"]) / "tiny.json").write_text(json.dumps(rows), encoding="utf-8")
    return "tiny.json"


def summary_of(env: Mapping[str, str]) -> str:
    return Path(env["GITHUB_STEP_SUMMARY"]).read_text(encoding="utf-8")


def run_entrypoint(env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batch_invariance.action"],
        env=dict(env),
        cwd=env["GITHUB_WORKSPACE"],
        capture_output=True,
        text=True,
        timeout=120,
    )


# --------------------------------------------------------------------------- fakes


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def fake_github_jwt(lifetime_s: int = 600) -> str:
    """An unsigned JWT shaped like a GitHub Actions OIDC token for audience 'sigstore'.

    sigstore does not check the token's signature on the client (Fulcio does), so this is
    enough to exercise identity detection and parsing; it never leaves loopback.
    """
    now = int(time.time())
    claims = {
        "iss": ACTIONS_ISSUER,
        "aud": "sigstore",
        "sub": "repo:octo/repo:ref:refs/heads/main",
        "iat": now,
        "nbf": now,
        "exp": now + lifetime_s,
        "job_workflow_ref": WORKFLOW_REF,
        "repository": "octo/repo",
    }
    header = {"alg": "RS256", "typ": "JWT"}
    return ".".join(
        [_b64(json.dumps(header).encode()), _b64(json.dumps(claims).encode()), _b64(b"sig")]
    )


@contextmanager
def oidc_endpoint(token: str) -> Iterator[str]:
    """A loopback stand-in for ACTIONS_ID_TOKEN_REQUEST_URL; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.headers.get("Authorization") != "bearer request-token":
                self.send_response(403)
                self.end_headers()
                return
            body = json.dumps({"value": token}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Handler) as base:
        yield f"{base}/token?api-version=2.0"


class FakeSigner:
    """Stands in for Fulcio + Rekor: records what it was asked to sign."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, str]] = []
        self.statements: list[dict[str, object]] = []

    def sign(self, payload: bytes, token: str) -> str:
        self.calls.append((payload, token))
        return json.dumps({"fake_bundle": True, "n_bytes": len(payload)})

    def sign_statement(self, statement: bytes, token: str) -> str:
        self.statements.append(json.loads(statement))
        return json.dumps({"fake_dsse_bundle": True, "n_bytes": len(statement)})


class BrokenSigner:
    """Stands in for a Fulcio that cannot be reached."""

    def sign(self, payload: bytes, token: str) -> str:
        from batch_invariance.errors import InfraError

        raise InfraError("sigstore signing failed: fulcio unreachable")

    def sign_statement(self, statement: bytes, token: str) -> str:
        return self.sign(statement, token)


def run_signed(
    env: dict[str, str], signer: FakeSigner | BrokenSigner, token: str
) -> tuple[int, str]:
    """Run the action with ``sign: true`` and an ambient GitHub OIDC token ``token`` (a
    loopback token endpoint, the process environment made ``env``): its exit code and output."""
    with oidc_endpoint(token) as url:
        env.update({"INPUT_SIGN": "true", "ACTIONS_ID_TOKEN_REQUEST_URL": url,
                    "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "request-token"})  # fmt: skip
        patch = with_process_env(env)
        buf = io.StringIO()
        try:
            code = action.run_action(env, signer=signer, out=buf)
        finally:
            patch.undo()
    return code, buf.getvalue()


def with_process_env(env: Mapping[str, str]) -> pytest.MonkeyPatch:
    """Make os.environ equal to ``env`` (sigstore's detector reads os.environ)."""
    patch = pytest.MonkeyPatch()
    for key in list(os.environ):
        if key.startswith(("INPUT_", "GITHUB_", "ACTIONS_")):
            patch.delenv(key)
    for key, value in env.items():
        patch.setenv(key, value)
    return patch


# --------------------------------------------------------------------------- entrypoint, mock


def test_mock_mode_entrypoint_writes_outputs_summary_and_fails_require(tmp_path: Path) -> None:
    env = actions_env(tmp_path, mode="mock", sign="false")
    proc = run_entrypoint(env)
    assert proc.returncode == exitcodes.NOT_PROMOTABLE, proc.stderr
    out = outputs_of(env)
    assert set(action_outputs.OUTPUT_NAMES) <= set(out)
    assert out["verdict"] == "GREEN" and out["status"] == "green"
    assert out["promotable"] == "false"
    assert out["divergent-ids"] == "0"
    assert out["cell"] == "mock/512/4"
    assert out["bundle-path"] == ""
    # Relative to the workspace, so a later host-side step (upload-artifact) can use it.
    assert not Path(out["cert-path"]).is_absolute()
    cert_file = Path(env["GITHUB_WORKSPACE"]) / out["cert-path"]
    cert = json.loads(cert_file.read_text())
    assert cert["source"] == "mock" and cert["status"] == "green"
    assert out["cell-id"] == cert_file.stem

    summary = summary_of(env)
    assert "## batch-invariance: GREEN" in summary
    assert "| F1 | pass |" in summary and "| F5 | **fail** |" in summary
    assert "rule of three" in summary
    assert "does not generalize" in summary
    assert "Mock run" in summary
    assert "::error title=batch-invariance GREEN::" in proc.stdout
    assert "can never pass require green" in proc.stdout
    assert "Traceback" not in proc.stderr
    # No workset input: the plan names the length ladder of the mock's slot, and it ran.
    assert "batch-invariance: plan: work-set: length ladder, 32 distinct prompts" in proc.stdout
    assert cert["provenance"]["workset"]["n_rows"] == 32


def test_mock_mode_can_never_pass_require_promotable(tmp_path: Path) -> None:
    env = actions_env(tmp_path, mode="mock", sign="false", require="promotable")
    buf = io.StringIO()
    code = action.run_action(env, out=buf)
    assert code == exitcodes.NOT_PROMOTABLE
    assert outputs_of(env)["promotable"] == "false"
    assert "::notice" not in buf.getvalue()


def test_mock_mode_reports_ignored_live_only_inputs(tmp_path: Path) -> None:
    env = actions_env(tmp_path, mode="mock", sign="false", **{"server-flags": "-ngl\n99"})
    env["INPUT_WORKSET"] = tiny_workset(env)
    buf = io.StringIO()
    action.run_action(env, out=buf)
    assert "::notice title=batch-invariance::input server-flags is ignored in mock mode" in (
        buf.getvalue()
    )


def test_sign_without_oidc_fails_before_running_with_one_clear_line(tmp_path: Path) -> None:
    env = actions_env(tmp_path, mode="mock", sign="true")
    proc = run_entrypoint(env)
    assert proc.returncode == exitcodes.USAGE
    errors = [line for line in proc.stdout.splitlines() if line.startswith("::error")]
    assert len(errors) == 1
    assert "signing impossible" in errors[0]
    assert "id-token: write" in errors[0]
    assert outputs_of(env) == {}, "no verdict outputs without a run"
    assert not (Path(env["GITHUB_WORKSPACE"]) / "batch-invariance-certs").exists()


def test_sign_with_ambient_github_oidc_writes_bundle_next_to_cert(tmp_path: Path) -> None:
    signer = FakeSigner()
    token = fake_github_jwt()
    env = actions_env(tmp_path, mode="mock", sign="true")
    env["INPUT_WORKSET"] = tiny_workset(env)  # what is signed, not the verdict, is under test
    code, _ = run_signed(env, signer, token)
    assert code == exitcodes.NOT_PROMOTABLE  # signed, but a mock cert still cannot pass
    out = outputs_of(env)
    workspace = Path(env["GITHUB_WORKSPACE"])
    cert_file = workspace / out["cert-path"]
    bundle_file = workspace / out["bundle-path"]
    assert bundle_file.name == cert_file.name + ".sigstore.json"
    assert json.loads(bundle_file.read_text())["fake_bundle"] is True
    assert len(signer.calls) == 1
    payload, used_token = signer.calls[0]
    assert payload == cert_file.read_bytes(), "the signature covers the cert's exact bytes"
    assert used_token == token
    assert "Signature bundle" in summary_of(env)
    # The in-toto Test Result attestation is signed in the same step, beside the cert.
    assert (cert_file.parent / (cert_file.name + ".intoto.sigstore.json")).is_file()
    (statement,) = signer.statements
    assert statement["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"


def test_signing_failure_after_the_run_is_its_own_failure(tmp_path: Path) -> None:
    env = actions_env(tmp_path, mode="mock", sign="true")
    env["INPUT_WORKSET"] = tiny_workset(env)
    code, printed = run_signed(env, BrokenSigner(), fake_github_jwt())
    assert code == exitcodes.INFRA
    assert "::error title=batch-invariance signing failed" in printed
    out = outputs_of(env)
    assert out["bundle-path"] == "" and out["cert-path"], "cert kept, reported, not signed"


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("inputs", "needle"),
    [
        ({"mode": "dry"}, "input mode must be live or mock"),
        ({"ctx": "lots"}, "input ctx must be an integer"),
        ({"parallel": "1"}, "input parallel must be at least 2"),
        ({"reps": "0"}, "input reps must be at least 1"),
        ({"require": "amber"}, "input require must be green, promotable, cert or none"),
        ({"sign": "maybe"}, "input sign must be true or false"),
        ({"server-bin": "bin/llama-server"}, "set both server-bin and model"),
        ({"engine": "ollama"}, "input engine must be one of llama-cpp-python, llama-server,"),
        ({"engine": "vllm"}, "input engine vllm needs server-bin and model"),
    ],
)
def test_bad_inputs_are_configuration_errors_without_a_verdict(
    tmp_path: Path, inputs: dict[str, str], needle: str
) -> None:
    env = actions_env(tmp_path, **{"sign": "false", **inputs})
    buf = io.StringIO()
    code = action.run_action(env, out=buf, provisioner=_no_provision)
    assert code == exitcodes.USAGE
    assert "::error title=batch-invariance configuration error (no verdict)::" in buf.getvalue()
    assert needle in buf.getvalue()
    # No verdict: at most the plan and the cell's name for the failure's artifact.
    assert set(outputs_of(env)) <= {"cell-id", "debug-paths"}


def _no_provision() -> tuple[Path, Path]:
    raise AssertionError("must not provision for a bad input")


def test_infrastructure_failure_is_distinct_and_has_no_verdict(tmp_path: Path) -> None:
    def provision_fails() -> tuple[Path, Path]:
        from batch_invariance.errors import InfraError

        raise InfraError("llama-server build failed; see build.log")

    env = actions_env(tmp_path, sign="false")
    buf = io.StringIO()
    code = action.run_action(env, out=buf, provisioner=provision_fails)
    assert code == exitcodes.INFRA
    assert "::error title=batch-invariance infrastructure failure (no verdict)::" in buf.getvalue()
    outputs = outputs_of(env)
    assert set(outputs) == {"cell-id", "debug-paths"}  # no verdict: the artifact's plan only
    assert outputs["cell-id"] == "embedded__ctx2048__N4"
    plan = Path(env["GITHUB_WORKSPACE"]) / outputs["debug-paths"]
    assert plan.name == "embedded__ctx2048__N4.plan.txt"
    assert plan.read_text().startswith("no plan: the step ended before its cell was prepared")
    assert "infrastructure failure" in summary_of(env)


def test_unwritable_github_output_is_an_infrastructure_failure(tmp_path: Path) -> None:
    env = actions_env(tmp_path, mode="mock", sign="false")
    env["INPUT_WORKSET"] = tiny_workset(env)
    env["GITHUB_OUTPUT"] = str(tmp_path)  # a folder: appending to it fails
    proc = run_entrypoint(env)
    assert proc.returncode == exitcodes.INFRA, proc.stderr
    assert "::error title=batch-invariance infrastructure failure (no verdict)::" in proc.stdout
    assert "cannot write the runner file" in proc.stdout
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- pieces


def test_inputs_keep_hyphens_and_accept_underscores(tmp_path: Path) -> None:
    env = {"GITHUB_WORKSPACE": str(tmp_path), "INPUT_N-PREDICT": "7", "INPUT_GATE_PASSES": "3"}
    got = action_inputs.read_inputs(env)
    assert got.n_predict == 7 and got.gate_passes == 3
    assert got.out_dir == tmp_path / "batch-invariance-certs"
    assert got.sign is True and got.require == "green" and got.mode == "live"
    flags = action_inputs.read_inputs({"INPUT_SERVER-FLAGS": "-ngl\n 99 \n\n--flash-attn\n"})
    assert flags.server_flags == ("-ngl", "99", "--flash-attn")


#: Inputs and outputs of the composite wrapper itself (not passed to the entrypoint).
WRAPPER_INPUTS = ("image", "base-image", "gpus", "github-token", "upload")
WRAPPER_OUTPUTS = ("attestation-path", "artifact")


def _action_yml() -> tuple[str, str, str, str]:
    text = (REPO / "action.yml").read_text(encoding="utf-8")
    inputs_block = "\n" + text.split("\ninputs:\n", 1)[1].split("\noutputs:\n", 1)[0]
    outputs_block = text.split("\noutputs:\n", 1)[1].split("\nruns:\n", 1)[0]
    runs_block = text.split("\nruns:\n", 1)[1]
    return text, inputs_block, outputs_block, runs_block


def test_action_yml_declares_exactly_the_entrypoint_inputs_and_outputs() -> None:
    _, inputs_block, outputs_block, runs_block = _action_yml()
    names = re.findall(r"^  ([a-z-]+):$", inputs_block, flags=re.M)
    assert names == [*action_inputs.INPUT_DEFAULTS, *WRAPPER_INPUTS]
    for name, default in action_inputs.INPUT_DEFAULTS.items():
        chunk = inputs_block.split(f"\n  {name}:\n", 1)[1]
        chunk = re.split(r"^  [a-z-]+:$", chunk, maxsplit=1, flags=re.M)[0]
        assert re.search(r"^    description: \S", chunk, flags=re.M), name
        found = re.search(r"^    default: (.*)$", chunk, flags=re.M)
        assert found, name
        assert found.group(1).strip().strip('"') == default, name
        # The container step hands every entrypoint input on, as the runner would.
        env_name = "INPUT_" + name.upper().replace("-", "_")
        assert f"        {env_name}: ${{{{ inputs.{name} }}}}\n" in runs_block, name
    outputs = re.findall(r"^  ([a-z-]+):$", outputs_block, flags=re.M)
    assert outputs == [*action_outputs.OUTPUT_NAMES, *WRAPPER_OUTPUTS]
    for name in action_outputs.OUTPUT_NAMES:
        assert f"value: ${{{{ steps.cell.outputs.{name} }}}}" in outputs_block, name


def test_action_yml_is_one_step_that_runs_signs_uploads_and_sets_the_status() -> None:
    _, _, _, runs_block = _action_yml()
    assert runs_block.startswith("  using: composite\n")
    steps = re.split(r"^    - ", runs_block.split("\n  steps:\n", 1)[1], flags=re.M)[1:]
    assert len(steps) == 3
    cell, name, upload = steps
    # 1: the container, run by the action's own script from the action's own source.
    assert cell.startswith("id: cell\n")
    assert "BI_ACTION_PATH: ${{ github.action_path }}" in cell
    assert '"$BI_ACTION_PATH/action/run-container.sh"' in cell
    assert "if:" not in cell  # its exit code is the job status
    # 2: an artifact name unique per cell, job and run attempt, even when the cell failed.
    assert "always()" in name and "RUN_ATTEMPT: ${{ github.run_attempt }}" in name
    assert "JOB_KEY: ${{ steps.cell.outputs.job-key }}" in name
    script = (REPO / "action" / "name-artifact.sh").read_text(encoding="utf-8")
    assert "name=bi-${kind}-${CELL_ID}-${key}-a${RUN_ATTEMPT}" in script and "kind=cert" in script
    # 3: the SHA-pinned upload of cert, bundle and attestation, RED included, and of the plan
    # and server logs of a step that did not pass (exit 4: no cert, still an artifact).
    assert re.search(r"uses: actions/upload-artifact@[0-9a-f]{40} # v4", upload)
    assert "steps.cell.outputs.debug-paths != ''" in name
    assert "always()" in upload and "steps.artifact.outputs.name != ''" in upload
    for path in ("cell.outputs.cert-path", "cell.outputs.bundle-path", "attestation-path",
                 "cell.outputs.debug-paths"):  # fmt: skip
        assert path in upload
    assert "name: ${{ steps.artifact.outputs.name }}" in upload


def _name_artifact(tmp_path: Path, cert: str, attempt: str, key: str) -> dict[str, str]:
    out = tmp_path / f"out-{attempt}-{key}-{bool(cert)}"
    out.touch()
    subprocess.run(
        ["bash", str(REPO / "action" / "name-artifact.sh")],
        env={"PATH": os.environ["PATH"], "CELL_ID": "m__ctx512__N2", "CERT_PATH": cert,
             "RUN_ATTEMPT": attempt, "JOB_KEY": key, "GITHUB_OUTPUT": str(out)},
        check=True,
        timeout=30,
    )  # fmt: skip
    return parse_github_output(out.read_text())


def test_name_artifact_script_is_unique_per_job_and_attempt(tmp_path: Path) -> None:
    cert = tmp_path / "m__ctx512__N2.json"
    cert.write_text("{}")
    (tmp_path / (cert.name + ".intoto.sigstore.json")).write_text("{}")
    names = []
    for attempt, key in (("1", "split"), ("2", "split"), ("1", "unified")):
        got = _name_artifact(tmp_path, str(cert), attempt, key)
        assert got["attestation-path"] == str(cert) + ".intoto.sigstore.json"
        names.append(got["name"])
    split = hashlib.sha256(b"split").hexdigest()[:8]
    unified = hashlib.sha256(b"unified").hexdigest()[:8]
    assert names == [f"bi-cert-m__ctx512__N2-{split}-a1", f"bi-cert-m__ctx512__N2-{split}-a2",
                     f"bi-cert-m__ctx512__N2-{unified}-a1"]  # fmt: skip
    # A step that ended without a cert: named apart, so it is never taken for a cert; two
    # jobs of one run that failed on one cell, apart from each other.
    failed = [_name_artifact(tmp_path, "", "1", key) for key in ("split", "unified")]
    assert failed == [
        {"name": f"bi-failed-m__ctx512__N2-{split}-a1", "attestation-path": ""},
        {"name": f"bi-failed-m__ctx512__N2-{unified}-a1", "attestation-path": ""},
    ]


def test_cell_workflow_names_its_artifact_with_the_same_script() -> None:
    cell = yaml.safe_load((REPO / ".github" / "workflows" / "cell.yml").read_text())
    (step,) = [s for s in cell["jobs"]["cell"]["steps"] if s.get("id") == "name"]
    assert step["run"] == ".batch-invariance-src/action/name-artifact.sh"
    assert "toJSON(inputs)" in step["env"]["JOB_KEY"]


def test_workflows_never_install_a_package_by_name() -> None:
    """Every install is this repository's own source (action path or pinned checkout)."""
    files = [
        *(REPO / ".github" / "workflows").glob("*.yml"),
        *(REPO / "examples" / "workflows").glob("*.yml"),
        REPO / "action.yml",
        REPO / "install" / "action.yml",
    ]
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"pip install[^\n]*\bbatch-invariance\b", text), path.name
        assert "inputs.package" not in text, path.name
    cell = (REPO / ".github" / "workflows" / "cell.yml").read_text(encoding="utf-8")
    assert "repository: ${{ job.workflow_repository }}" in cell
    assert "ref: ${{ job.workflow_sha }}" in cell
    install = (REPO / "install" / "action.yml").read_text(encoding="utf-8")
    assert "SRC: ${{ github.action_path }}/.." in install


def test_deploy_gate_runs_on_every_pull_request_and_checks_models_toml() -> None:
    text = (REPO / "examples" / "workflows" / "deploy-gate.yml").read_text(encoding="utf-8")
    trigger = text.split("\non:\n", 1)[1].split("\npermissions:", 1)[0]
    assert trigger.strip() == "pull_request:"
    assert "paths" not in trigger
    assert "deploy/llama-server.sh" in text and "--attestation" in text
    # check-deploy itself requires signatures, with the same tag-or-SHA identity pattern.
    gate = text.split("batch-invariance check-deploy", 1)[1].split("done", 1)[0]
    assert '--cert-identity-regexp "$CERT_IDENTITY_REGEXP"' in gate
    assert "--allow-unsigned" not in text


def test_example_identity_policy_accepts_tag_and_sha_pins_only() -> None:
    for name in ("deploy-gate.yml", "release-certs.yml"):
        text = (REPO / "examples" / "workflows" / name).read_text(encoding="utf-8")
        found = re.search(r"CERT_IDENTITY_REGEXP: '([^']+)'", text)
        assert found, name
        pattern = re.compile(found.group(1))
        base = "https://github.com/addiplus/batch-invariance/.github/workflows/cell.yml@"
        assert pattern.fullmatch(base + "refs/tags/v0")
        assert pattern.fullmatch(base + "refs/tags/v0.3.1")
        assert pattern.fullmatch(base + "0123456789abcdef0123456789abcdef01234567")
        assert not pattern.fullmatch(base + "refs/heads/main")
        assert not pattern.fullmatch(base.replace("addiplus", "mallory") + "refs/tags/v0")
        assert not pattern.fullmatch(base + "refs/tags/v0-evil")


def test_github_output_is_multiline_safe() -> None:
    tricky = {"a": "line one\nline two", "b": "EOF\nx<<y", "c": ""}
    assert parse_github_output(action_outputs.format_outputs(tricky)) == tricky


def test_annotation_escapes_newlines_and_property_separators() -> None:
    line = render.annotation("error", "t: a, b", "50% done\nnext")
    assert line == "::error title=t%3A a%2C b::50%25 done%0Anext"
    assert "\n" not in line


def test_input_defaults_come_from_the_run_live_table() -> None:
    from batch_invariance.service.request import ACTION_DEFAULTS, RUN_LIVE_DEFAULTS

    action, run_live = ACTION_DEFAULTS.measurement, RUN_LIVE_DEFAULTS.measurement
    for name in ("gate_passes", "reps", "n_predict"):
        assert getattr(action, name) == getattr(run_live, name)
        assert action_inputs.INPUT_DEFAULTS[name.replace("_", "-")] == str(getattr(action, name))
    assert action_inputs.INPUT_DEFAULTS["ctx"] == str(ACTION_DEFAULTS.ctx)


@pytest.mark.parametrize("workflow", ["cell.yml", "gate.yml"])
def test_workflow_defaults_are_the_actions(workflow: str, tmp_path: Path) -> None:
    """An input the reusable workflows share with the Action defaults to the Action's value,
    or to empty, which the Action reads as its default: one schedule for the CLI, the Action
    and the workflows (``gate-passes`` and ``reps`` once defaulted to 8 and 3 here)."""
    declared = yaml.safe_load((REPO / ".github" / "workflows" / workflow).read_text())
    shared = {
        name: spec["default"]
        for name, spec in declared[True]["workflow_call"]["inputs"].items()
        if name in action_inputs.INPUT_DEFAULTS
    }
    assert {"gate-passes", "reps", "mode"} <= set(shared)
    base = action_inputs.read_inputs({"GITHUB_WORKSPACE": str(tmp_path)})
    for name, default in shared.items():
        text = str(default).lower() if isinstance(default, bool) else str(default)
        assert text in ("", action_inputs.INPUT_DEFAULTS[name]), (workflow, name, text)
        empty = {"GITHUB_WORKSPACE": str(tmp_path), f"INPUT_{name.upper()}": ""}
        assert action_inputs.read_inputs(empty) == base, name


def test_live_inputs_become_the_same_request_the_cli_builds(tmp_path: Path) -> None:
    from batch_invariance.action.inputs import live_request
    from batch_invariance.cli import build_parser
    from batch_invariance.commands.cell_options import request_from_args

    env = {
        "GITHUB_WORKSPACE": str(tmp_path),
        "INPUT_SERVER-BIN": "bin/llama-server",
        "INPUT_MODEL": "m.gguf",
        "INPUT_SERVER-FLAGS": "-ngl\n99",
        "INPUT_SCORER": "p.m:S",
    }
    from_action = live_request(action_inputs.read_inputs(env), None)
    args = build_parser().parse_args(
        ["run-live", "--server-bin", str(tmp_path / "bin/llama-server"), "--model",
         str(tmp_path / "m.gguf"), "--ctx", "2048", "--parallel", "4", "--out-dir",
         str(tmp_path / "batch-invariance-certs"), "--server-flag=-ngl", "--server-flag=99",
         "--scorer", "p.m:S"]
    )  # fmt: skip
    from_cli = request_from_args(args)
    # Both measure the length ladder when no work-set is named; the Action also ends a cell
    # once RED is proven (--stop-on-red is its default).
    stop = replace(from_cli.measurement, stop_on_red=True)
    assert from_action == replace(from_cli, measurement=stop)


def test_red_cert_report_names_divergent_ids_with_excerpts(tmp_path: Path) -> None:
    from batch_invariance.cli import main

    assert main(["run-mock", "--out-dir", str(tmp_path), "--batch-divergence"]) == 1
    path = next(p for p in tmp_path.glob("*.json"))
    cert = load_cert(path)
    assert cert.status == "failed"
    outputs = action_outputs.outputs_for(cert, path, None, tmp_path)
    assert outputs["verdict"] == "RED"
    assert int(outputs["divergent-ids"]) == len(cert.divergence_report.ac.divergent_ids) > 0
    summary = render.summary_markdown(cert, "green", False, outputs)
    assert "## batch-invariance: RED" in summary
    assert "| id | pass | field | A | C |" in summary
    first = cert.divergence_report.ac.divergent_ids[0]
    assert first in summary
    note = render.verdict_annotation(cert, "green", False, outputs["cell"])
    assert note.startswith("::error title=batch-invariance RED::")
    assert "batching changed scored outputs" in note


def test_the_engine_input_runs_that_engine_through_the_same_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batch_invariance.action.inputs import live_request
    from batch_invariance.cli import build_parser
    from batch_invariance.commands.cell_options import request_from_args
    from tests.unit.engines.test_engine_cells import stand_in

    # The ladder of a 2048-token slot sends prompts of up to 1,800 tokens through three arms:
    # prompts cost no time, and a token 1 ms (twice the mock's default, so the one C pass's
    # overlap is sampled with room to spare).
    knobs = {"token_delay_s": 0.001, "prompt_token_delay_s": 0.0}
    monkeypatch.setenv("FAKE_ENGINE_KNOBS", json.dumps(knobs))
    small = {"gate-passes": "1", "reps": "1", "n-predict": "64"}
    files = {"server-bin": "vllm", "model": "model.safetensors"}
    env = actions_env(tmp_path, sign="false", engine="vllm", **small, **files)
    workspace = Path(env["GITHUB_WORKSPACE"])
    stand_in(workspace, "vllm")
    hf_model_files(workspace)
    inputs = action_inputs.read_inputs(env)
    assert inputs.engine == "vllm"
    args = build_parser().parse_args(
        ["run-live", "--engine", "vllm", "--server-bin", str(workspace / "vllm"), "--model",
         str(workspace / "model.safetensors"), "--ctx", "2048", "--parallel", "4", "--gate-passes",
         "1", "--reps", "1", "--n-predict", "64", "--out-dir",
         str(workspace / "batch-invariance-certs")]
    )  # fmt: skip
    from_cli = request_from_args(args)
    stop = replace(from_cli.measurement, stop_on_red=True)
    assert live_request(inputs, None) == replace(from_cli, measurement=stop)
    buf = io.StringIO()
    code = action.run_action(env, out=buf, provisioner=_no_provision)
    outputs = outputs_of(env)
    # The stand-in never diverges, and the default plan can pass: the ladder's 32 prompts,
    # answers at the length gate's 64 tokens, sequences past 3/4 of the slot.
    assert code == exitcodes.PROMOTABLE, buf.getvalue()
    cert = json.loads((workspace / outputs["cert-path"]).read_text())
    assert cert["source"] == "live" and cert["provenance"]["engine"] == "vllm"
    assert "--max-num-seqs" in cert["provenance"]["servers"][1]["argv"]
    # No workset input: the Action measured the length ladder of the cell's slot, 32 distinct
    # documents whose sequences reach past 3/4 of it (vLLM has no /tokenize the tool reads:
    # fitted with the offline estimate, measured with the server's own counts).
    workset = cert["provenance"]["workset"]
    assert workset["source"].startswith("length ladder (ctx 2048") and workset["n_rows"] == 32
    assert workset["duplicate_prompts"] == []
    scope = cert["sequence_scope"]
    assert scope["slot_ctx"] == 2048 and scope["longest"] >= scope["required"] == 1536
    assert all(band["rows_compared"] for band in scope["bands"])
