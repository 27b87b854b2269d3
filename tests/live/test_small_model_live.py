"""The small model in the real cached llama-server (CPU): it loads, answers a completion to the
full budget, and tokenizes exactly as its source vocab's own test strings say (the
``ggml-vocab-phi-3.gguf.inp``/``.out`` pairs the sdist ships, as llama.cpp's test-tokenizer-0
reads them: no BOS, special tokens as text)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from batch_invariance.provision.embedded import Layout, Provisioned
from batch_invariance.provision.small_model import make_small_model

SEP = "\n__ggml_vocab_test__\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tree(live_pair: Provisioned) -> Path:
    return Layout(live_pair.server_bin.parents[3]).src_dir / "llama.cpp"


@pytest.fixture(scope="module")
def server(
    live_pair: Provisioned, tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("small-live")
    model = make_small_model(tree, folder / "small.gguf", seed=0).path
    port = _free_port()
    with (folder / "server.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(live_pair.server_bin), "-m", str(model), "--host", "127.0.0.1", "--port",
             str(port), "-c", "512", "-np", "1"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None, (folder / "server.log").read_text()[-2000:]
            time.sleep(0.3)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_it_answers_a_completion_to_the_full_budget(server: str) -> None:
    body = {"prompt": "The capital of France is", "n_predict": 24, "temperature": 0}
    got = requests.post(f"{server}/completion", json=body, timeout=60).json()
    assert got["tokens_predicted"] == 24 and got["content"]  # no end-of-turn: zeroed rows
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
    reply = requests.post(f"{server}/v1/chat/completions", json=chat, timeout=60).json()
    assert reply["choices"][0]["finish_reason"] == "length"


def test_it_tokenizes_like_its_source_vocab(server: str, tree: Path) -> None:
    vocab = tree / "models" / "ggml-vocab-phi-3.gguf"
    texts = vocab.with_name(vocab.name + ".inp").read_text(encoding="utf-8").split(SEP)
    wants = vocab.with_name(vocab.name + ".out").read_text(encoding="utf-8").split("\n")
    assert len(texts) >= 30
    for text, want in zip(texts, wants, strict=True):
        body = {"content": text, "add_special": False, "parse_special": False}
        got = requests.post(f"{server}/tokenize", json=body, timeout=30).json()["tokens"]
        assert got == [int(t) for t in want.split()], text
