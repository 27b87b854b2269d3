"""Test helpers for the live shell: a tiny GGUF writer and fake server executables.

The fake server is a real process (a Python script on loopback) that speaks the few
endpoints :class:`batch_invariance.servers.process.ServerProcess` uses (``/health``,
``/props``); its behaviour is chosen by ``--fake-*`` flags passed through ``extra_flags``.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

_U32, _I32, _F32, _BOOL, _STR, _ARR, _U64 = 4, 5, 6, 7, 8, 9, 10

#: The gate flags a small test cell runs under. Its plan (a few prompts, short answers, a
#: slot it does not fill) cannot reach GREEN under the default gates, and run-live, sweep and
#: demo refuse such a plan before any launch, as its --dry-run does; looser gates are
#: accepted, and the cert is never promotable. Their bound (1) still needs 3 distinct prompts
#: (the rule of three): a smaller work-set is refused whatever the gates.
LOOSE_GATES = ("--max-bound", "1", "--min-answer-tokens", "1", "--min-slot-fill", "0")


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(v: Any) -> tuple[int, bytes]:
    if isinstance(v, bool):
        return _BOOL, struct.pack("<?", v)
    if isinstance(v, int):
        return _U32, struct.pack("<I", v)
    if isinstance(v, float):
        return _F32, struct.pack("<f", v)
    if isinstance(v, str):
        return _STR, _s(v)
    if isinstance(v, list):
        if v and isinstance(v[0], str):
            body = b"".join(_s(x) for x in v)
            return _ARR, struct.pack("<IQ", _STR, len(v)) + body
        body = b"".join(struct.pack("<i", x) for x in v)
        return _ARR, struct.pack("<IQ", _I32, len(v)) + body
    raise TypeError(v)


def write_gguf(
    path: Path,
    meta: dict[str, Any],
    *,
    magic: bytes = b"GGUF",
    version: int = 3,
    padding: int = 4096,
) -> Path:
    """Write a header-only GGUF file with ``meta`` (plus ``padding`` bytes as "weights")."""
    out = bytearray(magic + struct.pack("<I", version) + struct.pack("<QQ", 0, len(meta)))
    for key, value in meta.items():
        vtype, raw = _value(value)
        out += _s(key) + struct.pack("<I", vtype) + raw
    out += b"\0" * padding
    path.write_bytes(bytes(out))
    return path


def dense_meta(**over: Any) -> dict[str, Any]:
    """Metadata shaped like a small dense model (Gemma-3-270M's geometry)."""
    meta: dict[str, Any] = {
        "general.architecture": "gemma3",
        "general.name": "tiny test model",
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(300)],
        "tokenizer.ggml.token_type": list(range(300)),
        "gemma3.block_count": 18,
        "gemma3.embedding_length": 640,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1,
        "gemma3.attention.key_length": 256,
        "gemma3.attention.value_length": 256,
        "gemma3.context_length": 32768,
        "gemma3.attention.sliding_window": 512,
    }
    meta.update(over)
    return meta


FAKE_SERVER = r"""
import http.server, json, os, subprocess, sys, time
args = sys.argv[1:]
def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default
if "--version" in args:
    print("version: 0.0.0-fake (build 1)")
    sys.exit(0)
print("fake llama-server starting:", " ".join(args), flush=True)
marker = os.environ.get("FAKE_SERVER_MARKER")
if marker:
    with open(marker, "a") as fh:
        fh.write(" ".join(args) + "\n")
if "--fake-exit" in args:
    print("error: fake failure before listening", flush=True)
    sys.exit(3)
if "--fake-child" in args:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("child pid", child.pid, flush=True)
if "--fake-hang" in args:
    time.sleep(600)
port = int(opt("--port"))
slots = int(opt("--fake-slots", opt("--parallel", "1")))
ballast = bytearray(int(opt("--fake-ballast-mb", "0")) * 1024 * 1024)
for i in range(0, len(ballast), 4096):
    ballast[i] = 1
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _json(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/props":
            self._json(200, {"total_slots": slots})
        else:
            self._json(404, {"error": "not found"})
print("listening on", port, flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def fake_settings() -> str:
    """Python lines that give a fake the test's ``FAKE_*`` settings as they are now: a server
    the tool starts gets only neutral and engine variables, so they cannot come through its
    environment."""
    import os

    settings = {k: v for k, v in os.environ.items() if k.startswith("FAKE_")}
    return f"import os\nos.environ.update({settings!r})\n"


def fake_server(tmp: Path, name: str = "llama-server") -> Path:
    """An executable fake ``llama-server`` script in ``tmp`` (with the ``FAKE_*`` settings of
    the moment it is written)."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / name
    path.write_text(f"#!{sys.executable}\n{fake_settings()}{FAKE_SERVER}")
    path.chmod(0o755)
    return path


def exiting_server(tmp: Path, name: str = "llama-server") -> Path:
    """A server binary that prints an error and exits at once (any arguments)."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / name
    path.write_text("#!/bin/sh\necho 'error: this server cannot start (test)' >&2\nexit 1\n")
    path.chmod(0o755)
    return path


def group_alive(pgid: int, settle_s: float = 2.0) -> bool:
    """True while a live (non-zombie) process of group ``pgid`` exists after ``settle_s``.

    Zombies are ignored: an orphan reparented to a container's init may wait to be reaped.
    """
    import os
    import time

    import psutil

    deadline = time.monotonic() + settle_s
    while True:
        alive = False
        for proc in psutil.process_iter(["status"]):
            try:
                if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    alive = True
                    break
            except (ProcessLookupError, psutil.Error):
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def start_decoy(folder: Path, seconds: int = 600) -> subprocess.Popen[bytes]:
    """Start a process named ``llama-server`` that the test (not the tool) owns: whatever the
    tool does, this one must survive. The caller kills it."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "llama-server"
    exe.write_text(f"#!/bin/sh\nexec sleep {seconds}\n")
    exe.chmod(0o755)
    return subprocess.Popen([str(exe)], start_new_session=True)


def fake_cell_files(tmp_path: Path, monkeypatch: Any, rows: int) -> dict[str, Path]:
    """A fake server binary (it records each launch in ``marker``), a tiny GGUF and a work-set
    of ``rows`` prompts, for CLI tests that must launch nothing real."""
    marker = tmp_path / "launched"
    monkeypatch.setenv("FAKE_SERVER_MARKER", str(marker))
    ws = tmp_path / "ws.json"
    ws.write_text(json.dumps([{"id": f"p{i}", "prompt": f"say {i}"} for i in range(rows)]))
    return {
        "bin": fake_server(tmp_path / "bin"),
        "model": write_gguf(tmp_path / "tiny.gguf", dense_meta(), padding=1 << 20),
        "ws": ws,
        "out": tmp_path / "out",
        "marker": marker,
    }


def hf_model_files(folder: Path) -> Path:
    """A model folder as vLLM loads it: ``config.json`` with Gemma-3-270M's geometry (what the
    memory guard reads to size vLLM's reservation) and a few bytes of weights, whose file is
    returned."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 18,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
        "hidden_size": 640, "torch_dtype": "float32",
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    weights = folder / "model.safetensors"
    weights.write_bytes(b"weights")
    return weights
