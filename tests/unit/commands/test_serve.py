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
from batch_invariance.engines.llama_server.env import NEUTRAL_ENV_NAMES, is_engine_variable
from batch_invariance.gate.serve_line import ServeRefused
from batch_invariance.gate.served import serve_argv
from batch_invariance.serve.exec_argv import descriptor_argv
from tests.support.deploy_world import _live_cert, _provenance, world  # noqa: F401 (the fixture)

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


#: The stand-in server: records its argv, environment, PID, open descriptors and the sha256 of
#: the model it is given, read through the path its argv names (what llama-server opens).
STAND_IN = """#!/usr/bin/env python3
import hashlib, json, os, sys
fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[name] = os.readlink("/proc/self/fd/" + name)
    except OSError:
        pass
model = sys.argv[sys.argv.index("--model") + 1]
json.dump({"argv": sys.argv, "env": dict(os.environ), "pid": os.getpid(), "fds": fds,
           "cwd": os.getcwd(),
           "model_sha256": hashlib.sha256(open(model, "rb").read()).hexdigest()},
          open(RECORD, "w"))
"""


@pytest.fixture()
def served(world: dict[str, Path], tmp_path: Path) -> dict[str, Path]:  # noqa: F811
    """A stand-in binary and a promotable cert whose provenance fingerprints it (folders and
    files only their owner can write, whatever the umask)."""
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir(mode=0o755)
    record = tmp_path / "record.json"
    binary.write_text(STAND_IN.replace("RECORD", repr(str(record))))
    binary.chmod(0o755)
    model = tmp_path / "m" / world["model"].name
    model.parent.mkdir(mode=0o755)
    model.write_bytes(world["model"].read_bytes())
    model.chmod(0o644)
    provenance: dict[str, Any] = _provenance(model, 4, "split")
    for server in provenance["servers"]:
        server["argv"][0] = str(binary)
    provenance["server_binary"] = {
        "path": str(binary),
        "sha256": hashlib.sha256(binary.read_bytes()).hexdigest(),
    }
    cert = _live_cert(tmp_path / "certs", model, provenance=provenance)
    return {"binary": binary, "model": model, "cert": cert, "record": record}


def _fd(path: str) -> str:
    assert path.startswith("/proc/self/fd/"), path
    return path.rsplit("/", 1)[1]


def test_serve_execs_the_measured_argv_in_an_allowlisted_environment(
    served: dict[str, Path],
) -> None:
    clean = {k: v for k, v in os.environ.items() if not is_engine_variable(k)}
    command = [sys.executable, "-m", "batch_invariance", "serve", str(served["cert"]),
               "--allow-unsigned", "--", "--port", "8080", "--api-key", "k"]  # fmt: skip
    hostile = {
        "LLAMA_ARG_UBATCH": "512", "XDG_CONFIG_HOME": "/home/u/.config", "LD_AUDIT": "/x.so",
        "LD_PRELOAD": "/y.so", "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0",
        "MALLOC_ARENA_MAX": "1", "GGML_SCHED_DEBUG": "1", "MY_APP_SETTING": "1",
        "LC_ALL": "C.UTF-8", "TZ": "UTC",
    }  # fmt: skip
    child = subprocess.Popen(command, env={**clean, **hostile}, stderr=subprocess.PIPE, text=True)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 0, stderr
    seen = json.loads(served["record"].read_text())
    assert seen["pid"] == child.pid  # exec: serve became the server, no child process
    data = json.loads(served["cert"].read_text())
    measured = data["provenance"]["servers"][1]["argv"]
    # Exec'd from the binary's descriptor: the kernel hands a #! script's interpreter the
    # path it exec'd, /proc/self/fd/N, which is the binary serve hashed, still open.
    binary_fd = _fd(seen["argv"][0])
    assert seen["fds"][binary_fd] == os.path.realpath(served["binary"])
    # The model is handed over as its descriptor, open across the exec, and what the server
    # reads through it is the measured bytes.
    model_arg = seen["argv"][seen["argv"].index("--model") + 1]
    model_fd = _fd(model_arg)
    assert seen["fds"][model_fd] == os.path.realpath(served["model"])
    assert seen["model_sha256"] == data["provenance"]["model_file"]["sha256"]
    # The cert measured cache-off traffic only: serve turns the prompt cache off, so every
    # request is computed from scratch as in the measured arms; the API keeps the measured
    # model name (--alias).
    cold = [*measured, "--no-cache-prompt"]
    expected = descriptor_argv(serve_argv(cold, ["--port", "8080", "--api-key", "k"]), model_arg)
    assert seen["argv"] == [seen["argv"][0], *expected[1:]]
    assert expected[-2:] == ("--alias", str(served["model"]))
    assert "prompt cache off (--no-cache-prompt)" in stderr
    assert f"from /proc/self/fd/{binary_fd} " in stderr and f"as {model_arg} " in stderr
    # Only neutral variables reach the server (the cert recorded no engine variable).
    for name in ("LLAMA_ARG_UBATCH", "LD_AUDIT", "LD_PRELOAD", "GLIBC_TUNABLES",
                 "MALLOC_ARENA_MAX", "GGML_SCHED_DEBUG", "MY_APP_SETTING"):  # fmt: skip
        assert name not in seen["env"], name
    assert seen["env"]["XDG_CONFIG_HOME"] == "/dev/null"
    assert (seen["env"]["LC_ALL"], seen["env"]["TZ"]) == ("C.UTF-8", "UTC")
    assert set(seen["env"]) <= {*NEUTRAL_ENV_NAMES, "LC_ALL", "LC_CTYPE", "XDG_CONFIG_HOME"}
    assert "k" not in stderr.split()  # the api key is not echoed


def _swap(path: Path, data: bytes) -> None:
    """Another file renamed over ``path`` (what a deploy script or an attacker does)."""
    other = path.with_name(f".{path.name}.swap")
    other.write_bytes(data)
    other.chmod(path.stat().st_mode)
    os.replace(other, path)


def test_serve_runs_the_bytes_it_hashed_whatever_the_paths_hold_later(
    served: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both files are swapped at their paths after serve opened them (before it hashes), and
    the model once more before the exec: the hashes pass (read through the descriptors), and
    the server runs the original binary and reads the original model."""
    from batch_invariance.serve import pinned_files

    data = json.loads(served["cert"].read_text())["provenance"]
    impostor = f"#!/bin/sh\necho impostor > {served['record']}\n".encode()
    real_sha256_fd = pinned_files.sha256_fd

    def swap_then_hash(fd: int) -> str:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        binary = path == served["binary"].resolve()
        _swap(path, impostor if binary else b"GGUF swapped model")
        return real_sha256_fd(fd)

    execs: list[dict[str, Any]] = []

    def fake_execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        model_arg = argv[argv.index("--model") + 1]
        fds = (int(_fd(path)), int(_fd(model_arg)))
        inheritable = [os.get_inheritable(f) for f in fds]
        execs.append({"path": path, "argv": argv, "inheritable": inheritable})
        _swap(served["model"], b"GGUF swapped again after hashing")
        subprocess.run(argv, executable=path, pass_fds=fds, env=env, timeout=60, check=True)

    monkeypatch.setattr(pinned_files, "sha256_fd", swap_then_hash)
    monkeypatch.setattr(os, "execve", fake_execve)
    assert main(["serve", str(served["cert"]), "--allow-unsigned"]) == exitcodes.PROMOTABLE
    assert len(execs) == 1 and execs[0]["inheritable"] == [True, True]
    assert execs[0]["argv"][0] == str(served["binary"])  # argv[0] as measured
    seen = json.loads(served["record"].read_text())  # the stand-in ran, not the impostor
    assert seen["argv"][0] == execs[0]["path"]
    assert seen["model_sha256"] == data["model_file"]["sha256"]
    on_disk = hashlib.sha256(served["model"].read_bytes()).hexdigest()
    assert on_disk != data["model_file"]["sha256"]  # the path holds other bytes by now
    assert served["binary"].read_bytes() == impostor
    capsys.readouterr()


def test_serve_refuses_files_others_could_change(
    served: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cert = [str(served["cert"]), "--allow-unsigned"]
    folder = served["binary"].parent.resolve()
    for mode, words in ((0o775, "group-writable"), (0o757, "world-writable")):
        folder.chmod(mode)
        assert main(["serve", *cert]) == exitcodes.USAGE
        err = capsys.readouterr().err
        assert f"folder {folder} is {words} without the sticky bit" in err, err
        assert f"chmod go-w {folder}" in err and len(err.strip().splitlines()) == 1
    folder.chmod(0o755)
    served["model"].chmod(0o664)
    assert main(["serve", *cert]) == exitcodes.USAGE
    assert "is group-writable (mode 0664)" in capsys.readouterr().err
    served["model"].chmod(0o644)
    if os.geteuid() == 0:  # only root can give a folder to another user
        os.chown(folder, 4321, -1)
        assert main(["serve", *cert]) == exitcodes.USAGE
        assert f"folder {folder} belongs to uid 4321" in capsys.readouterr().err
        os.chown(folder, 0, -1)
    assert not served["record"].exists()  # nothing ever started


def test_the_model_is_handed_over_by_descriptor_under_its_measured_name() -> None:
    fd = "/proc/self/fd/7"
    assert descriptor_argv(MEASURED, fd) == (
        *MEASURED[:2],
        fd,
        *MEASURED[3:],
        "--alias",
        "/m/a.gguf",
    )
    short = ("/opt/llama-server", "-m", "/m/a.gguf", "-a", "gemma", "--port", "1")
    assert descriptor_argv(short, fd) == ("/opt/llama-server", "-m", fd, *short[3:])
    comma = ("/opt/llama-server", "-m", "/m/a,b.gguf")
    assert descriptor_argv(comma, fd) == ("/opt/llama-server", "-m", fd)
    with pytest.raises(ServeRefused, match="names no --model"):
        descriptor_argv(("/opt/llama-server", "--port", "1"), fd)


def test_serve_sets_the_recorded_engine_variables_and_refuses_another_value(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    from batch_invariance.engines.llama_server.env import served_env

    recorded = {"GGML_SCHED_DEBUG": "1"}
    got = served_env({"PATH": "/usr/bin", "LD_AUDIT": "/x.so"}, recorded)
    assert got.env == {"PATH": "/usr/bin", "GGML_SCHED_DEBUG": "1",
                       "XDG_CONFIG_HOME": "/dev/null"}  # fmt: skip
    assert got.refused == () and got.dropped == ("LD_AUDIT",)
    refused = served_env({"GGML_SCHED_DEBUG": "0"}, recorded).refused
    assert refused == ("GGML_SCHED_DEBUG=0 (the cert recorded GGML_SCHED_DEBUG=1)",)


def test_the_measured_server_gets_the_same_rule() -> None:
    from batch_invariance.engines.llama_server.env import engine_env, measured_env

    parent = {"PATH": "/usr/bin", "HOME": "/root", "LD_AUDIT": "/x.so", "GGML_X": "1",
              "LLAMA_ARG_UBATCH": "512", "MALLOC_ARENA_MAX": "1", "LC_ALL": "C"}  # fmt: skip
    child = measured_env(parent)
    assert child == {"PATH": "/usr/bin", "HOME": "/root", "GGML_X": "1", "LC_ALL": "C",
                     "XDG_CONFIG_HOME": "/dev/null"}  # fmt: skip
    # What the cert records (engine_env) is every variable the child has beyond the neutral.
    assert engine_env(child) == {"GGML_X": "1"}


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
    tool = Path(sys.executable).with_name("batch-invariance")
    assert tool.is_file(), "the package's launcher (pip install -e .)"
    unit = tmp_path / "llm.service"
    unit.write_text(
        f"[Service]\nExecStart={tool} serve {served['cert']} --allow-unsigned"
        " -- --host 0.0.0.0 --port 8080 --api-key k --metrics --timeout 30\n"
    )
    args = ["check-deploy", str(unit), "--certs", str(certs), "--allow-unsigned"]
    assert main(args) == exitcodes.PROMOTABLE
    assert "pass  " in capsys.readouterr().out
    # Identity by content: a program named batch-invariance that is not this tool.
    impostor = tmp_path / "impostor" / "batch-invariance"
    impostor.parent.mkdir()
    impostor.write_text('#!/bin/sh\nexec /opt/other-llama-server "$@"\n')
    impostor.chmod(0o755)
    unit.write_text(f"[Service]\nExecStart={impostor} serve {served['cert']} --allow-unsigned\n")
    assert main(args) == exitcodes.NOT_PROMOTABLE
    assert f"serve line: {impostor} is not this tool" in capsys.readouterr().out
    # A bare name is looked up with the PATH the file sets.
    script = tmp_path / "run.sh"
    serve_line = f"exec batch-invariance serve {served['cert']} --allow-unsigned\n"
    script.write_text(f"export PATH={impostor.parent}:/usr/bin\n" + serve_line)  # fmt: skip
    args[1] = str(script)
    assert main(args) == exitcodes.NOT_PROMOTABLE
    assert "is not this tool" in capsys.readouterr().out
    script.write_text(f"export PATH={tool.parent}:/usr/bin\n"
                      + serve_line)  # fmt: skip
    assert main(args) == exitcodes.PROMOTABLE
    # Variables that reach the Python running serve: not covered.
    script.write_text(f"export PATH={tool.parent}:/usr/bin PYTHONPATH=/tmp/evil\n"
                      + serve_line)  # fmt: skip
    assert main(args) == exitcodes.NOT_PROMOTABLE
    assert "PYTHONPATH reaches the Python that runs serve" in capsys.readouterr().out
    script.write_text(f"export PATH={tool.parent}:/usr/bin\n"
                      f"exec batch-invariance serve {served['cert']} -- -ub 512\n")  # fmt: skip
    assert main(args) == exitcodes.USAGE
    assert "-ub is not neutral" in capsys.readouterr().err
