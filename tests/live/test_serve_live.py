"""`batch-invariance serve` against the real llama-server: a promotable cert of this binary and
model (``-ub 1``) starts exactly the server it records; anything else is refused before a
server starts; SIGTERM to serve stops the server (serve is it). The cert is either earned here
(a live GREEN, opt-in: ``BATCH_INVARIANCE_LIVE_GREEN=1``) or recorded from factory evidence
with the real files' sha256 and run-live's argv."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from batch_invariance import exitcodes
from batch_invariance.cli import main
from batch_invariance.gate.served import serve_argv
from batch_invariance.provision.embedded import Provisioned
from batch_invariance.serve.exec_argv import descriptor_argv

#: The length ladder of a 256-token slot (32 distinct documents, bound 3/32 under the default
#: 0.10, sequences filling the slot: -ub 1 is bitwise invariant up to position 256 on this
#: build), answers long enough for the default answer-length gate, two passes, B as the serial
#: repeat: the smallest cell that can be promotable. A long request timeout: other work on a
#: shared host slows every token.
GREEN_CELL = (
    "--ctx 256 --parallel 4 --gate-passes 2 --n-predict 80 --no-serial-repeat "
    "--endpoint completions --req-timeout 900"
)


#: Earning a live GREEN runs -ub 1 (one token per graph) over 32 prompts: minutes on idle
#: cores, far longer on a shared host, so it is opt-in; the recorded cert below runs always.
EARN_ENV = "BATCH_INVARIANCE_LIVE_GREEN"


def _earned(live_pair: Provisioned, root: Path, model: Path) -> Path:
    """A promotable live GREEN measured here, on a copy of the model."""
    out = root / "out"
    code = main(
        ["run-live", "--server-bin", str(live_pair.server_bin), "--model", str(model),
         "--out-dir", str(out), *GREEN_CELL.split(),
         "--server-flag=-ub", "--server-flag=1"]
    )  # fmt: skip
    certs = list(out.rglob("*__ctx256__N4.json"))
    assert len(certs) == 1, f"run-live exited {code} and wrote {len(certs)} cert(s)"
    assert code == exitcodes.PROMOTABLE, json.loads(certs[0].read_text())["decision_reasons"]
    return certs[0]


def _recorded(
    live_pair: Provisioned, root: Path, model: Path, layout: str = "split", folder: str = "certs"
) -> Path:
    """A promotable cert whose verdict the core decided from factory evidence and whose
    provenance records the real binary and model (their sha256) and the argv run-live would
    start them with (ctx 1024, N 4, ``layout``, -ub 1), in ``root/folder``."""
    from tests.support.deploy_world import _live_cert, _provenance

    provenance = _provenance(model, 4, layout, binary=live_pair.server_bin)
    for server in provenance["servers"]:
        server["argv"][0] = str(live_pair.server_bin)
    return _live_cert(root / folder, model, layout=layout, provenance=provenance)


@pytest.fixture(scope="module", params=["recorded", "earned"])
def green(
    request: pytest.FixtureRequest, live_pair: Provisioned, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """A promotable cert of the real server, on a copy of the model (a test may change it)."""
    if request.param == "earned" and not os.environ.get(EARN_ENV):
        pytest.skip(f"set {EARN_ENV}=1 to earn a live GREEN here (minutes on idle cores)")
    root = tmp_path_factory.mktemp("serve")
    model = root / live_pair.model.name
    shutil.copyfile(live_pair.model, model)
    make = _earned if request.param == "earned" else _recorded
    return {"root": root, "model": model, "cert": make(live_pair, root, model)}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(cert: Path, *extra: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    sink = log.open("wb") if log is not None else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-m", "batch_invariance", "serve", str(cert), "--allow-unsigned",
         *extra],
        stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _wait_health(proc: subprocess.Popen[bytes], url: str, deadline_s: float = 180.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"serve exited {proc.returncode} before the server was up"
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise AssertionError("the served llama-server did not come up")


def test_serve_execs_the_measured_server_and_sigterm_stops_it(
    green: dict[str, Path], tmp_path: Path
) -> None:
    port = _free_port()
    neutral = ["--", "--host", "127.0.0.1", "--port", str(port), "--api-key", "k",
               "--metrics", "--timeout", "30"]  # fmt: skip
    proc = _serve(green["cert"], *neutral, log=tmp_path / "serve.log")
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(proc, url)
        data = json.loads(green["cert"].read_text())
        measured = next(s["argv"] for s in data["provenance"]["servers"] if s["role"] == "BC")
        # exec: the process serve started is the server, with exactly this argv; the cert
        # measured cache-off traffic only, so serve turns the prompt cache off.
        # The model is handed over as serve's descriptor of it (its measured path as --alias).
        cold = [*measured, "--no-cache-prompt"]
        cmdline = psutil.Process(proc.pid).cmdline()
        model_arg = cmdline[cmdline.index("--model") + 1]
        assert model_arg.startswith("/proc/self/fd/")
        assert cmdline == list(descriptor_argv(serve_argv(cold, neutral[1:]), model_arg))
        props = requests.get(url + "/props", headers={"Authorization": "Bearer k"}, timeout=10)
        props.raise_for_status()
        body = props.json()
        assert body["total_slots"] == data["dispatch_n"] == 4
        assert body["default_generation_settings"]["n_ctx"] == data["ctx"]
        assert requests.get(url + "/metrics", timeout=5).status_code in (200, 401)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) is not None
        assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == "zombie"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_serve_refuses_before_anything_starts(
    green: dict[str, Path], tmp_path: Path, live_pair: Provisioned
) -> None:
    cert = green["cert"]
    done = subprocess.run(
        [sys.executable, "-m", "batch_invariance", "serve", str(cert), "--allow-unsigned", "--",
         "-ub", "512"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == exitcodes.USAGE and "-ub is not neutral" in done.stderr
    # A cert that is not promotable (a mock run's).
    assert main(["run-mock", "--out-dir", str(tmp_path / "mock")]) in (0, 1, 3)
    mock = next(p for p in (tmp_path / "mock").rglob("*.json") if "__ctx" in p.name)
    done = subprocess.run(
        [sys.executable, "-m", "batch_invariance", "serve", str(mock), "--allow-unsigned"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == exitcodes.NOT_PROMOTABLE and "not promotable" in done.stderr
    # One changed byte of the model file: not the measured cell.
    data = bytearray(green["model"].read_bytes())
    data[len(data) // 2] ^= 0x01
    green["model"].write_bytes(bytes(data))
    done = subprocess.run(
        [sys.executable, "-m", "batch_invariance", "serve", str(cert), "--allow-unsigned"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == exitcodes.NOT_PROMOTABLE
    assert "not the measured cell" in done.stderr and "model" in done.stderr


#: What an attacker (or a careless shell profile) could put in serve's environment: loader and
#: libc variables, and options the cert never measured.
HOSTILE = {
    "LD_AUDIT": "/nonexistent/audit.so", "LD_PRELOAD": "/nonexistent/preload.so",
    "LD_LIBRARY_PATH": "/nonexistent/lib", "LD_BIND_NOW": "1", "LD_DEBUG_OUTPUT": "/tmp/x",
    "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0", "MALLOC_ARENA_MAX": "2",
    "MALLOC_PERTURB_": "0", "LLAMA_ARG_CACHE_TYPE_K": "q8_0", "LLAMA_ARG_UBATCH": "512",
    "GGML_SCHED_DEBUG": "1", "XDG_CONFIG_HOME": "/tmp",
}  # fmt: skip


def test_serve_starts_the_server_with_none_of_a_hostile_environment(
    cell: dict[str, Path], tmp_path: Path, live_pair: Provisioned
) -> None:
    from batch_invariance.engines.llama_server.env import is_engine_variable, is_neutral_variable

    green = {"cert": cell["cert"]}
    port = _free_port()
    clean = {k: v for k, v in os.environ.items() if not is_engine_variable(k)}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "batch_invariance", "serve", str(green["cert"]),
         "--allow-unsigned", "--", "--host", "127.0.0.1", "--port", str(port)],
        env={**clean, **HOSTILE}, stdout=(tmp_path / "serve.log").open("wb"),
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_health(proc, f"http://127.0.0.1:{port}")
        ready_s = time.monotonic() - started
        # The process serve became is the real server: read what the kernel gave it.
        assert psutil.Process(proc.pid).exe() == os.path.realpath(live_pair.server_bin)
        raw = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        environ = dict(e.decode().split("=", 1) for e in raw if e)
        leaked = sorted(set(environ) & set(HOSTILE) - {"XDG_CONFIG_HOME"})
        assert leaked == [], leaked
        assert not [k for k in environ if k.startswith(("LD_", "MALLOC_", "GLIBC_", "LLAMA_"))]
        assert environ["XDG_CONFIG_HOME"] == "/dev/null"
        assert all(is_neutral_variable(k) for k in environ if k != "XDG_CONFIG_HOME"), environ
        print(
            f"\nserve hostile-environment check: caller had {len(clean) + len(HOSTILE)} "
            f"variables ({len(HOSTILE)} hostile); the started llama-server (pid {proc.pid}) has "
            f"{len(environ)}: {', '.join(sorted(environ))}; 0 hostile; healthy after "
            f"{ready_s:.1f} s"
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _completion(url: str) -> list[int]:
    body = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0,
            "cache_prompt": False, "return_tokens": True}  # fmt: skip
    reply = requests.post(url + "/completion", json=body, timeout=120)
    reply.raise_for_status()
    return list(reply.json()["tokens"])


def _sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def test_the_served_process_keeps_the_hashed_files_when_both_paths_are_swapped(
    tmp_path: Path, live_pair: Provisioned
) -> None:
    """serve verified the files and exec'd; then another file is renamed over the model and
    over the binary. The running server is still the hashed binary inode (/proc/PID/exe), its
    mapping of the model is the hashed inode (/proc/PID/maps), it reads the model through
    serve's descriptor, and it answers as before."""
    from tests.support.deploy_world import _live_cert, _provenance

    binary = tmp_path / "bin" / "llama-server"  # copies: the swap must not touch the cache
    binary.parent.mkdir(mode=0o755)
    shutil.copyfile(live_pair.server_bin, binary)
    binary.chmod(0o755)
    model = tmp_path / "m" / live_pair.model.name
    model.parent.mkdir(mode=0o755)
    shutil.copyfile(live_pair.model, model)
    model.chmod(0o644)
    provenance = _provenance(model, 4, "split", binary=binary)
    for server in provenance["servers"]:
        server["argv"][0] = str(binary)
    cert = _live_cert(tmp_path / "certs", model, provenance=provenance)
    inodes = {"binary": binary.stat().st_ino, "model": model.stat().st_ino}
    port = _free_port()
    proc = _serve(cert, "--", "--host", "127.0.0.1", "--port", str(port),
                  log=tmp_path / "serve.log")  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(proc, url)
        before = _completion(url)
        cmdline = psutil.Process(proc.pid).cmdline()
        model_fd = cmdline[cmdline.index("--model") + 1].rsplit("/", 1)[1]
        # Swap both paths: other bytes renamed over them, as a deploy script would.
        swapped_model = model.with_name("swap.gguf")
        swapped_model.write_bytes(b"GGUF" + os.urandom(4096))
        os.replace(swapped_model, model)
        swapped_binary = binary.with_name("swap")
        swapped_binary.write_bytes(b"#!/bin/sh\nexit 1\n")
        os.replace(swapped_binary, binary)
        exe = f"/proc/{proc.pid}/exe"
        assert os.readlink(exe) == f"{binary} (deleted)"
        assert os.stat(exe).st_ino == inodes["binary"]
        assert _sha256(exe) == provenance["server_binary"]["sha256"]
        mapped = [
            line.split()
            for line in Path(f"/proc/{proc.pid}/maps").read_text().splitlines()
            if str(model) in line
        ]
        assert mapped, "the server maps the model"
        assert {int(m[4]) for m in mapped} == {inodes["model"]}
        assert all(m[-1] == "(deleted)" for m in mapped)
        held = f"/proc/{proc.pid}/fd/{model_fd}"
        assert os.readlink(held) == f"{model} (deleted)"
        assert _sha256(held) == provenance["model_file"]["sha256"]
        props = requests.get(url + "/props", timeout=10).json()
        assert props["model_path"] == f"/proc/self/fd/{model_fd}"
        assert props["model_alias"] == str(model)  # the measured name, as the API reports it
        after = _completion(url)
        assert after == before
        print(
            f"\nserve swap check: llama-server pid {proc.pid} after both paths were swapped: "
            f"exe inode {inodes['binary']} ({os.readlink(exe)}), sha256 as hashed; "
            f"{len(mapped)} mapping(s) of model inode {inodes['model']} (deleted); "
            f"--model /proc/self/fd/{model_fd} -> {os.readlink(held)}, sha256 as hashed; "
            f"same {len(after)} tokens before and after the swap"
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


#: The operator's line of the recorded cert's cell: a 4096-token pool split into 4 slots of
#: 1024, one token per graph, the prompt cache off (the cert measured cache-off traffic).
OPERATORS = "-c 4096 -np 4 -ub 1 --no-cache-prompt --cache-ram 0"


def _certs_line(
    certs: Path, binary: Path, model: Path, *flags: str, base: str = OPERATORS,
    signing: tuple[str, ...] = ("--allow-unsigned",),
) -> list[str]:  # fmt: skip
    return [sys.executable, "-m", "batch_invariance", "serve", "--certs", str(certs), *signing,
            "--", str(binary), "-m", str(model), *base.split(), *flags]  # fmt: skip


@pytest.fixture(scope="module")
def cell(live_pair: Provisioned, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One copy of the model (in a folder of its own), the real binary, and two recorded certs
    of that pair, measured once for every refusal below: ``certs`` (4 split slots of 1024) and
    ``unified`` (a unified pool of 4 whose ladder filled only the pool's 4th share, 1024)."""
    root = tmp_path_factory.mktemp("cell")
    model = root / "m" / live_pair.model.name
    model.parent.mkdir(mode=0o755)
    shutil.copyfile(live_pair.model, model)
    model.chmod(0o644)
    cert = _recorded(live_pair, root, model)
    unified = _recorded(live_pair, root, model, layout="unified", folder="unified")
    return {"root": root, "model": model, "binary": live_pair.server_bin,
            "certs": cert.parent, "cert": cert, "unified": unified.parent}  # fmt: skip


def _copy_certs(cell: dict[str, Path], folder: Path, mode: int) -> Path:
    folder.mkdir(mode=mode)
    folder.chmod(mode)  # mkdir's mode is masked by the umask
    shutil.copyfile(cell["cert"], folder / cell["cert"].name)
    return folder


def _tampered(cell: dict[str, Path], tmp: Path) -> dict[str, Any]:
    """The cert's folder copied and one word of its measured argv edited after signing: the
    measured server now claims a q8_0 K cache (the digest no longer matches)."""
    folder = _copy_certs(cell, tmp / "tampered", 0o755)
    cert = folder / cell["cert"].name
    data = json.loads(cert.read_text())
    for server in data["provenance"]["servers"]:
        server["argv"] += ["--cache-type-k", "q8_0"]
    cert.write_text(json.dumps(data, indent=2))
    return {"certs": folder}


def _changed_model(cell: dict[str, Path], tmp: Path) -> dict[str, Any]:
    model = tmp / cell["model"].name
    data = bytearray(cell["model"].read_bytes())
    data[len(data) // 2] ^= 0x01
    model.write_bytes(bytes(data))
    model.chmod(0o644)
    return {"model": model}


def _shared_binary(cell: dict[str, Path], tmp: Path) -> dict[str, Any]:
    folder = tmp / "bin"
    folder.mkdir()
    folder.chmod(0o775)  # group-writable: a group member could swap what loads from it
    shutil.copy2(cell["binary"], folder / "llama-server")
    return {"binary": folder / "llama-server"}


def _llama_library(cell: dict[str, Path], tmp: Path) -> dict[str, Any]:
    """The real binary copied to a folder of its own, measured there (the provisioned build
    has ggml in it: the cert records no library), then a ggml CPU backend put beside it (ggml
    loads such backends from the binary's folder at run time; no file names it)."""
    from tests.support.deploy_world import _live_cert, _provenance
    from tests.support.elf import write_elf

    folder = tmp / "build"
    folder.mkdir()
    folder.chmod(0o755)
    binary = folder / "llama-server"
    shutil.copy2(cell["binary"], binary)
    provenance = _provenance(cell["model"], 4, "split", binary=binary)
    for server in provenance["servers"]:
        server["argv"][0] = str(binary)
    cert = _live_cert(tmp / "certs", cell["model"], provenance=provenance)
    write_elf(folder / "libggml-cpu-haswell.so", ("libc.so.6",))
    return {"certs": cert.parent, "binary": binary}


def _cpu_variant(cell: dict[str, Path], tmp: Path) -> dict[str, Any]:
    """The real binary with a ggml CPU variant beside it, both measured (the cert records the
    library) on a host whose CPU had other SIMD features than this one."""
    from tests.support.deploy_world import _live_cert, _provenance
    from tests.support.elf import write_elf

    folder = tmp / "build"
    folder.mkdir()
    folder.chmod(0o755)
    binary = folder / "llama-server"
    shutil.copy2(cell["binary"], binary)
    write_elf(folder / "libggml-cpu-haswell.so", ("libc.so.6",))
    provenance = _provenance(cell["model"], 4, "split", binary=binary)
    for server in provenance["servers"]:
        server["argv"][0] = str(binary)
    provenance["host"] = {"cpu_flags": ["sse4_2", "avx"]}
    cert = _live_cert(tmp / "certs", cell["model"], provenance=provenance)
    return {"certs": cert.parent, "binary": binary}


def _grammar(cell: dict[str, Path], tmp: Path) -> dict[str, Any]:
    grammar = tmp / "answer.gbnf"
    grammar.write_text('root ::= "yes"\n')  # edited after any measurement: every answer "yes"
    return {"flags": ["--grammar-file", str(grammar)]}


#: Each row of docs/deploy.md's serve table, made to refuse on the real binary and model
#: before any server starts: (id, what to change, exit code, words the refusal names). A
#: change is a dict of the line's parts (``certs``, ``binary``, ``model``, ``flags``, ``base``,
#: ``signing``, ``env``, ``cwd``) or a function of the cell and a fresh folder returning one.
REFUSALS: list[tuple[str, Any, int, str]] = [
    ("np8", {"base": OPERATORS.replace("-np 4", "-np 8")}, exitcodes.NOT_PROMOTABLE, "N=8"),
    ("kvu-vs-split-cert", {"flags": ["-kvu"]}, exitcodes.NOT_PROMOTABLE,
     "KV layout unified (measured split)"),
    ("ub512", {"base": OPERATORS.replace("-ub 1", "-ub 512")}, exitcodes.NOT_PROMOTABLE, "-ub"),
    ("prompt-cache-on", {"base": OPERATORS.replace("--no-cache-prompt ", "")},
     exitcodes.NOT_PROMOTABLE, "cache"),
    ("unified-kvu", lambda c, t: {"certs": c["unified"], "flags": ["-kvu"]},
     exitcodes.NOT_PROMOTABLE, "the slot is 4096 tokens"),
    ("unified-no-np", lambda c, t: {"certs": c["unified"],
                                    "base": OPERATORS.replace("-np 4 ", "")},
     exitcodes.NOT_PROMOTABLE, "the slot is 4096 tokens"),
    ("tampered-cert", _tampered, exitcodes.CERT_INVALID, "digest"),
    ("no-signing-policy", {"signing": ()}, exitcodes.USAGE, "identity"),
    ("cert-in-open-folder", lambda c, t: {"certs": _copy_certs(c, t / "open", 0o777)},
     exitcodes.USAGE, "world-writable"),
    ("changed-model-byte", _changed_model, exitcodes.NOT_PROMOTABLE, "model"),
    ("binary-in-group-writable-folder", _shared_binary, exitcodes.USAGE, "group-writable"),
    ("llama-library-not-measured", _llama_library, exitcodes.NOT_PROMOTABLE,
     "llama.cpp library libggml-cpu-haswell.so"),
    ("cpu-variant-other-cpu", _cpu_variant, exitcodes.NOT_PROMOTABLE,
     "the cert measured a CPU with sse4_2 avx"),
    ("grammar-file", _grammar, exitcodes.NOT_PROMOTABLE, "--grammar-file"),
    ("unrecorded-engine-variable", {"env": {"GGML_SCHED_MAX_COPIES": "1"}},
     exitcodes.NOT_PROMOTABLE, "GGML_SCHED_MAX_COPIES=1"),
    ("log-file-over-model", lambda c, t: {"flags": ["--log-file", str(c["model"])]},
     exitcodes.USAGE, "which the server reads"),
    ("log-file-over-cert", lambda c, t: {"flags": ["--log-file", str(c["cert"])]},
     exitcodes.USAGE, "which the server reads"),
    ("log-file-in-binary-folder",
     lambda c, t: {"flags": ["--log-file", str(c["binary"].parent / "libggml-cpu.so")]},
     exitcodes.USAGE, "inside"),
    # As root, the server would write the loader's preload list.
    ("log-file-in-system-folder", {"flags": ["--log-file", "/etc/ld.so.preload"]},
     exitcodes.USAGE, "system folder"),
    # Relative to the caller's folder (serve execs the server in /): made absolute first.
    ("relative-log-file-over-model",
     lambda c, t: {"cwd": c["model"].parent, "flags": ["--log-file", c["model"].name]},
     exitcodes.USAGE, "which the server reads"),
    ("cert-and-certs", lambda c, t: {"signing": (str(c["cert"]), "--allow-unsigned")},
     exitcodes.USAGE, "either CERT"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "code", "named"), [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])  # fmt: skip
def test_serve_refuses_each_row_of_its_table_before_a_server_starts(
    cell: dict[str, Path], tmp_path: Path, change: Any, code: int, named: str
) -> None:
    """The real binary and model, the operator's line with one thing changed: serve refuses
    with the row's exit code and names what it refused, and no server ever starts (serve's
    own process exits; the port the line names stays free)."""
    from batch_invariance.engines.llama_server.env import is_engine_variable

    parts: dict[str, Any] = {
        "certs": cell["certs"], "binary": cell["binary"], "model": cell["model"], "flags": [],
        "base": OPERATORS, "signing": ("--allow-unsigned",), "env": {}, "cwd": tmp_path,
    }  # fmt: skip
    parts.update(change(cell, tmp_path) if callable(change) else change)
    port = _free_port()
    line = _certs_line(parts["certs"], parts["binary"], parts["model"], *parts["flags"],
                       "--host", "127.0.0.1", "--port", str(port), base=parts["base"],
                       signing=parts["signing"])  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not is_engine_variable(k)}
    environ: dict[str, str] = {**clean, **parts["env"]}
    done = subprocess.run(line, env=environ, cwd=parts["cwd"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == code, done.stderr
    assert named in done.stderr and "Traceback" not in done.stderr, done.stderr
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # nothing listens there: no server started
    print(f"\n{done.stderr.strip().splitlines()[-1]}")


def test_serve_certs_starts_the_operators_line_with_no_config_file_read(
    cell: dict[str, Path], tmp_path: Path
) -> None:
    """The deploy's own llama-server line after `serve --certs DIR --`: the real server starts
    with the measured cell (4 slots of 1024, in /), and reads no config file although the
    caller's relative XDG_CONFIG_HOME and relative HOME each hold a config.ini with another
    K cache type (the control: the same build started directly from that folder reads each)."""
    home = tmp_path / "home"
    for folder in ("cfg", ".config"):
        (home / folder / "llama.cpp").mkdir(parents=True)
        (home / folder / "llama.cpp" / "config.ini").write_text(
            "cache-type-k = q8_0\nubatch-size = 512\n"
        )
    env = {**os.environ, "XDG_CONFIG_HOME": "cfg", "HOME": "."}
    by_home = {k: v for k, v in env.items() if k != "XDG_CONFIG_HOME"}
    for control, read in ((env, "cfg/llama.cpp/config.ini"),
                          (by_home, "./.config/llama.cpp/config.ini")):  # fmt: skip
        direct = subprocess.run([str(cell["binary"]), "--version"], env=control, cwd=home,
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert f"using config file: {read}" in direct.stdout + direct.stderr, direct.stderr
    port = _free_port()
    line = _certs_line(cell["certs"], cell["binary"], cell["model"], "--host", "127.0.0.1",
                       "--port", str(port), "--log-file", "llm.log")  # fmt: skip
    proc = subprocess.Popen(line, env=env, cwd=home, stdout=(tmp_path / "serve.log").open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(proc, url)
        assert psutil.Process(proc.pid).exe() == os.path.realpath(cell["binary"])
        assert psutil.Process(proc.pid).cwd() == "/"
        body = requests.get(url + "/props", timeout=10).json()
        assert body["total_slots"] == 4
        assert body["default_generation_settings"]["n_ctx"] == 1024
        assert len(_completion(url)) > 0
        assert (home / "llm.log").is_file()  # the relative log path, made absolute
        said = (tmp_path / "serve.log").read_text(errors="replace") + (home / "llm.log").read_text(
            errors="replace"
        )
        assert "load_model" in said  # the server's own log is read here
        assert "using config file" not in said, "a config.ini was read"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _direct(binary: Path, model: Path, log: Path) -> tuple[list[int], str]:
    """The answer and the log of ``binary`` started directly on ``model`` with the operator's
    pool and no ``-np`` (the flag-less default: auto slots, one unified pool)."""
    port = _free_port()
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "-c", "4096", "-ub", "1", "--host", "127.0.0.1",
         "--port", str(port)],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(proc, url, deadline_s=120)
        return _completion(url), log.read_text(errors="replace")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_serve_refuses_a_split_model_whose_second_file_was_swapped(
    cell: dict[str, Path], live_pair: Provisioned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model split in two (as llama-gguf-split does) and a cert that measured its first
    file. The control: the same build started directly opens the second file by name beside
    the first, and a second file swapped after the measurement changes its answers (with no
    -np it also runs 4 slots that may each fill the 4096-token pool). serve refuses the split
    model before any server starts, whatever a cert measured of it."""
    from tests.support.gguf_split import split_gguf

    folder = tmp_path / "m"
    folder.mkdir(mode=0o755)
    first, second = split_gguf(cell["model"], folder, "gemma")
    # The recorded cert names its model as run-live names a split's: by its first file.
    monkeypatch.setattr("tests.support.deploy_world.MODEL", first.name[:-5])
    cert = _recorded(live_pair, tmp_path, first)
    measured, log = _direct(cell["binary"], first, tmp_path / "measured.log")
    assert "n_slots = 4, n_ctx_slot = 4096, kv_unified = 'true'" in log, log
    # Another second file: the same name and tensors, two of its layers' weights exchanged.
    split_gguf(cell["model"], tmp_path, "other", swap=True)[1].replace(second)
    swapped, _ = _direct(cell["binary"], first, tmp_path / "swapped.log")
    assert swapped != measured, "the swapped second file did not change the answer"
    done = subprocess.run(_certs_line(cert.parent, cell["binary"], first), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == exitcodes.NOT_PROMOTABLE, done.stderr
    assert "split into 2 files" in done.stderr, done.stderr
    print(f"\nsplit control: measured {measured}, swapped {swapped}; serve: {done.stderr}")
