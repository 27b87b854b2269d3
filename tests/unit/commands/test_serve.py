"""`batch-invariance serve`: exactly the measured server, neutral options only, or nothing.

A stand-in server binary (a shell script that records its argv, environment and PID) shows
what serve execs; the real llama-server is exercised in tests/live/test_serve_live.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from batch_invariance.deploy.serve_plan import ServeRefused, serve_argv
from batch_invariance.engines.llama_server.env import is_engine_variable
from tests.unit.deploy.test_check_deploy import _live_cert, _provenance, world  # noqa: F401 (the fixture)

MEASURED = (
    "/opt/llama-server", "--model", "/m/a.gguf", "--host", "127.0.0.1", "--port", "4711",
    "--parallel", "4", "--ctx-size", "4096", "--no-kv-unified", "--slots", "--cache-ram", "0",
    "--no-webui", "--metrics", "-ub", "1",
)  # fmt: skip


def test_neutral_options_are_added_or_replaced_and_nothing_else() -> None:
    argv = serve_argv(MEASURED, ["--port", "8080", "--api_key", "k", "--timeout", "30"])
    assert argv == (*MEASURED[:5], *MEASURED[7:], "--port", "8080", "--api_key", "k",
                    "--timeout", "30")  # fmt: skip
    assert serve_argv(MEASURED, []) == MEASURED
    for extra, named in (
        (["-ub", "512"], "-ub is not neutral"),
        (["--ctx_size", "8192"], "--ctx_size is not neutral"),
        (["--port=8080"], "--port=8080: llama-server has no such option"),
        (["--tags", "x"], "--tags is not neutral"),
        (["--port"], "missing its value"),
    ):
        with pytest.raises(ServeRefused, match=named):
            serve_argv(MEASURED, extra)


@pytest.fixture()
def served(world: dict[str, Path], tmp_path: Path) -> dict[str, Path]:  # noqa: F811
    """A stand-in binary and a promotable cert whose provenance fingerprints it."""
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    record = tmp_path / "record.json"
    binary.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv, 'env': dict(os.environ), 'pid': os.getpid()}}, "
        f"open({str(record)!r}, 'w'))\n"
    )
    binary.chmod(0o755)
    model = tmp_path / "m" / world["model"].name
    model.parent.mkdir()
    model.write_bytes(world["model"].read_bytes())
    provenance: dict[str, Any] = _provenance(model, 4, "split")
    for server in provenance["servers"]:
        server["argv"][0] = str(binary)
    provenance["server_binary"] = {
        "path": str(binary),
        "sha256": hashlib.sha256(binary.read_bytes()).hexdigest(),
    }
    cert = _live_cert(tmp_path / "certs", model, provenance=provenance)
    return {"binary": binary, "model": model, "cert": cert, "record": record}


def test_serve_execs_the_measured_argv_in_a_clean_environment(served: dict[str, Path]) -> None:
    clean = {k: v for k, v in os.environ.items() if not is_engine_variable(k)}
    command = [sys.executable, "-m", "batch_invariance", "serve", str(served["cert"]),
               "--allow-unsigned", "--", "--port", "8080", "--api-key", "k"]  # fmt: skip
    # A variable ggml reads that the measured server did not have: refused.
    ggml = {**clean, "GGML_SCHED_DEBUG": "1"}
    proc = subprocess.run(command, env=ggml, capture_output=True, text=True, timeout=120)
    assert proc.returncode == exitcodes.NOT_PROMOTABLE and "GGML_SCHED_DEBUG=1" in proc.stderr
    env = {**clean, "LLAMA_ARG_UBATCH": "512", "XDG_CONFIG_HOME": "/home/u/.config"}
    child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 0, stderr
    seen = json.loads(served["record"].read_text())
    assert seen["pid"] == child.pid  # exec: serve became the server, no child process
    measured = json.loads(served["cert"].read_text())["provenance"]["servers"][1]["argv"]
    # The cert measured cache-off traffic only: serve turns the prompt cache off, so every
    # request is computed from scratch as in the measured arms.
    cold = [*measured, "--no-cache-prompt"]
    assert seen["argv"] == list(serve_argv(cold, ["--port", "8080", "--api-key", "k"]))
    assert "prompt cache off (--no-cache-prompt)" in stderr
    assert "LLAMA_ARG_UBATCH" not in seen["env"] and seen["env"]["XDG_CONFIG_HOME"] == "/dev/null"
    assert "k" not in stderr.split()  # the api key is not echoed


def test_serve_refuses_before_anything_starts(
    served: dict[str, Path],
    world: dict[str, Path],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    cert = str(served["cert"])
    assert main(["serve", cert, "--allow-unsigned", "--", "-ub", "512"]) == exitcodes.USAGE
    assert "-ub is not neutral" in capsys.readouterr().err
    assert main(["serve", cert]) == exitcodes.USAGE  # no identity policy and no --allow-unsigned
    mock = next((world["certs"] / "mock").glob("*.json"))
    assert main(["serve", str(mock), "--allow-unsigned"]) == exitcodes.NOT_PROMOTABLE
    assert "is not promotable" in capsys.readouterr().err
    data = bytearray(served["model"].read_bytes())
    data[100] ^= 0xFF
    served["model"].write_bytes(bytes(data))
    assert main(["serve", cert, "--allow-unsigned"]) == exitcodes.NOT_PROMOTABLE
    assert "not the measured cell" in capsys.readouterr().err
    served["binary"].write_text(served["binary"].read_text() + "# changed\n")
    assert main(["serve", cert, "--allow-unsigned"]) == exitcodes.NOT_PROMOTABLE
    assert "server binary" in capsys.readouterr().err
    assert not served["record"].exists()  # nothing ever started
    tampered = served["cert"].with_name("tampered.json")
    tampered.write_text(served["cert"].read_text().replace('"ctx": 1024', '"ctx": 2048'))
    assert main(["serve", str(tampered), "--allow-unsigned"]) == exitcodes.CERT_INVALID


def test_check_deploy_reads_a_serve_line_as_that_certs_cell(
    served: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    certs = served["cert"].parent
    unit = tmp_path / "llm.service"
    unit.write_text(
        f"[Service]\nExecStart=/usr/bin/batch-invariance serve {served['cert']} --allow-unsigned"
        " -- --host 0.0.0.0 --port 8080 --api-key k --metrics --timeout 30\n"
    )
    args = ["check-deploy", str(unit), "--certs", str(certs), "--allow-unsigned"]
    assert main(args) == exitcodes.PROMOTABLE
    assert "pass  " in capsys.readouterr().out
    script = tmp_path / "run.sh"
    script.write_text(f"exec batch-invariance serve {served['cert']} -- -ub 512\n")
    assert main(["check-deploy", str(script), "--certs", str(certs), "--allow-unsigned"]) == (
        exitcodes.USAGE
    )
    assert "-ub is not neutral" in capsys.readouterr().err
