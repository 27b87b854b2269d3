"""`batch-invariance serve --certs DIR -- ENGINE ...`: the deploy states its cell as the
engine's own command; serve starts it only where a cert in DIR measured exactly that cell
with those files, and refuses every class a static reader could not see.

The stand-in server of tests/unit/commands/test_serve.py records what serve execs (argv,
environment, working folder); the real llama-server: tests/live/test_serve_live.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batch_invariance import exitcodes
from batch_invariance.engines.llama_server.env import is_engine_variable
from tests.support.deploy_world import (  # noqa: F401 (the fixture)
    OK_FLAGS,
    _live_cert,
    _provenance,
    world,
)
from tests.unit.commands.test_serve import STAND_IN, served  # noqa: F401 (the fixture)


def _serve(
    served: dict[str, Path],  # noqa: F811
    *flags: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    certs: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``serve --certs DIR --allow-unsigned -- BINARY -m MODEL FLAGS`` in a subprocess (serve
    execs: the stand-in replaces it and writes its record)."""
    clean = {k: v for k, v in os.environ.items() if not is_engine_variable(k)}
    command = [
        sys.executable, "-m", "batch_invariance", "serve",
        "--certs", str(certs or served["cert"].parent), "--allow-unsigned", "--",
        str(served["binary"]), "-m", str(served["model"]), *flags,
    ]  # fmt: skip
    return subprocess.run(
        command, env={**clean, **(env or {})}, cwd=cwd, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def _record(served: dict[str, Path]) -> dict[str, Any]:  # noqa: F811
    data: dict[str, Any] = json.loads(served["record"].read_text())
    served["record"].unlink()
    return data


def test_serve_finds_the_cert_that_measured_the_engine_command(
    served: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The operator's own line (flags in any spelling, neutral options mixed in) starts the
    measured server: serve is the process, in /, with no user config folder and none of the
    engine-option variables of its caller."""
    home = tmp_path / "home"
    (home / ".config" / "llama.cpp").mkdir(parents=True)
    (home / ".config" / "llama.cpp" / "config.ini").write_text("cache-type-k = q8_0\n")
    done = _serve(
        served, *OK_FLAGS.split(), "--port", "8080", "--log-file", "logs/llm.log",
        cwd=home,
        env={"HOME": ".", "XDG_CONFIG_HOME": ".config", "LLAMA_ARG_CACHE_TYPE_K": "q8_0"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = _record(served)
    data = json.loads(served["cert"].read_text())
    measured = next(s["argv"] for s in data["provenance"]["servers"] if s["role"] == "BC")
    assert seen["argv"][1] == measured[1] == "--model"  # then its descriptor
    assert seen["argv"][2].startswith("/proc/self/fd/")
    assert "--port" in seen["argv"] and seen["argv"][seen["argv"].index("--port") + 1] == "8080"
    # The relative log path is made absolute against the caller's folder before serve left it.
    assert seen["argv"][seen["argv"].index("--log-file") + 1] == str(home / "logs/llm.log")
    assert seen["cwd"] == "/"
    assert seen["env"]["XDG_CONFIG_HOME"] == "/dev/null"
    assert "LLAMA_ARG_CACHE_TYPE_K" not in seen["env"]
    assert f"{served['cert'].name} verified" in done.stderr


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (OK_FLAGS.replace("-np 4", "-np 8"), "no cert in"),
        (OK_FLAGS + " -kvu", "KV layout unified (measured split)"),
        (OK_FLAGS.replace("-ub 1", "-ub 512"), "no cert in"),
        (OK_FLAGS + " --grammar-file g.gbnf", "no cert in"),
        (OK_FLAGS.replace("--no-cache-prompt ", ""), "no cert in"),
    ],
)
def test_serve_refuses_a_command_no_cert_measured(
    served: dict[str, Path],  # noqa: F811
    change: str,
    named: str,
) -> None:
    done = _serve(served, *change.split())
    assert done.returncode == exitcodes.NOT_PROMOTABLE, done.stderr
    assert named in done.stderr and "Traceback" not in done.stderr
    assert not served["record"].exists()  # nothing started


def test_serve_refuses_an_engine_variable_the_cert_did_not_record(
    served: dict[str, Path],  # noqa: F811
) -> None:
    done = _serve(served, *OK_FLAGS.split(), env={"GGML_SCHED_MAX_COPIES": "1"})
    assert done.returncode == exitcodes.NOT_PROMOTABLE
    assert "environment GGML_SCHED_MAX_COPIES=1 (measured (unset))" in done.stderr


def test_serve_refuses_a_log_file_over_anything_the_server_reads(
    served: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    for target, named in (
        (served["model"], "which the server reads"),
        (served["binary"].parent / "libggml-cpu.so", "inside"),
        (served["cert"], "which the server reads"),
        # A server running as root would write the loader's preload list.
        (Path("/etc/ld.so.preload"), "system folder"),
        (Path("/usr/lib/x86_64-linux-gnu/libgomp.so.1"), "system folder"),
    ):
        done = _serve(served, *OK_FLAGS.split(), "--log-file", str(target))
        assert done.returncode == exitcodes.USAGE, done.stderr
        assert named in done.stderr and str(target) in done.stderr
    assert not served["record"].exists()
    logs = tmp_path / "logs"
    logs.mkdir()
    assert _serve(served, *OK_FLAGS.split(), "--log-file", str(logs / "a.log")).returncode == 0
    assert _serve(served, *OK_FLAGS.split(), "--log-file", "/dev/stderr").returncode == 0


def test_serve_refuses_a_cert_others_could_swap(
    served: dict[str, Path],  # noqa: F811
) -> None:
    folder = served["cert"].parent
    folder.chmod(0o777)
    try:
        done = _serve(served, *OK_FLAGS.split())
    finally:
        folder.chmod(0o755)
    assert done.returncode == exitcodes.USAGE
    assert "world-writable" in done.stderr and str(folder) in done.stderr
    assert not served["record"].exists()


def test_serve_refuses_the_line_before_anything(
    served: dict[str, Path],  # noqa: F811
) -> None:
    for words, code, named in (
        (["--certs", "d", str(served["cert"])], exitcodes.USAGE, "either CERT"),
        (["--certs", str(served["cert"].parent), "--allow-unsigned", "--", "-np", "4"],
         exitcodes.USAGE, "program first"),
        (["--certs", str(served["cert"]), "--allow-unsigned", "--", "x"], exitcodes.USAGE,
         "is a file"),
    ):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "batch_invariance", "serve", *words],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == code, (words, done.stderr)
        assert named in done.stderr and "Traceback" not in done.stderr


def _gguf_split(count: int) -> bytes:
    """A GGUF v3 header holding one metadata key, ``split.count`` (uint16 = ``count``)."""
    key = b"split.count"
    kv = struct.pack("<Q", len(key)) + key + struct.pack("<IH", 2, count)
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv + b"\x03" * 4096


def test_serve_refuses_a_split_model_even_where_a_cert_measured_its_first_file(
    tmp_path: Path,
) -> None:
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir(mode=0o755)
    record = tmp_path / "record.json"
    binary.write_text(STAND_IN.replace("RECORD", repr(str(record))))
    binary.chmod(0o755)
    model = tmp_path / "m" / "gemma-3-270m-q4_k_m.gguf"  # split.count decides, not the name
    model.parent.mkdir(mode=0o755)
    model.write_bytes(_gguf_split(2))
    model.chmod(0o644)
    provenance: dict[str, Any] = _provenance(model, 4, "split")
    for server in provenance["servers"]:
        server["argv"][0] = str(binary)
    sha = hashlib.sha256(binary.read_bytes()).hexdigest()
    provenance["server_binary"] = {"path": str(binary), "sha256": sha}
    cert = _live_cert(tmp_path / "certs", model, provenance=provenance)
    world_like = {"binary": binary, "model": model, "cert": cert, "record": record}
    done = _serve(world_like, *OK_FLAGS.split())
    assert done.returncode == exitcodes.NOT_PROMOTABLE, done.stderr
    assert "split into 2 files" in done.stderr
    assert not record.exists()


def test_every_test_the_serve_table_names_exists() -> None:
    """docs/deploy.md's table of what serve proves names, per row, the tests that make serve
    refuse; each named test (and each named case of the live refusal table) exists."""
    import re

    from tests.live.test_serve_live import REFUSALS
    from tests.support.paths import REPO

    text = (REPO / "docs" / "deploy.md").read_text()
    table = text.split("### What `serve` proves at start", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    sources = "\n".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    cases = {case[0] for case in REFUSALS}
    named = re.findall(r"`(test_\w+)(?:\[([^\]`]*)\])?`", table)
    assert len(rows) >= 12 and len(named) >= 30
    for row in rows[1:]:
        assert "`test_" in row and "live `test_" in row, row  # a unit and a live test each
    for name, case in named:
        assert f"def {name}(" in sources, name
        if name == "test_serve_refuses_each_row_of_its_table_before_a_server_starts":
            assert case in cases, case
