"""The small model: same seed, same bytes; well under 40 MB; its tokenizer is the vocab file's,
field for field; a llama header the server reads. Needs the unpacked pinned sdist (the cached
one; skipped where it is not there). Loading it in llama-server is tests/live."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batch_invariance.cache_dir import cache_root
from batch_invariance.host.facts import sha256_file
from batch_invariance.host.gguf import parse_info
from batch_invariance.provision.embedded import Layout
from batch_invariance.provision.small_model import load_gguf, make_small_model

TREE = Layout(cache_root()).src_dir / "llama.cpp"
pytestmark = pytest.mark.skipif(
    not (TREE / "gguf-py").is_dir(), reason="needs the unpacked pinned sdist (provision)"
)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_small_model(TREE, tmp_path_factory.mktemp("small") / "m.gguf", seed=0).path


def test_the_same_seed_gives_the_same_bytes(made: Path, tmp_path: Path) -> None:
    again = make_small_model(TREE, tmp_path / "again.gguf", seed=0)
    assert again.sha256 == sha256_file(made)
    other = make_small_model(TREE, tmp_path / "other.gguf", seed=1)
    assert other.sha256 != again.sha256 and other.size == again.size
    assert again.size < 16 * 1024**2  # well under 40 MB: it travels beside the 37 MB sdist


def test_the_same_seed_gives_the_same_bytes_in_another_process(made: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli.gguf"
    subprocess.run(
        [sys.executable, "-m", "batch_invariance", "provision", "--small-model", "--seed", "0",
         "--out", str(out)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert sha256_file(out) == sha256_file(made)


def _fields(gguf: Any, path: Path) -> dict[str, Any]:
    reader = gguf.GGUFReader(str(path))
    return {k: (f.types, f.contents()) for k, f in reader.fields.items()}


def test_its_tokenizer_is_the_vocab_files(made: Path) -> None:
    gguf = load_gguf(TREE)
    vocab = _fields(gguf, TREE / "models" / "ggml-vocab-phi-3.gguf")
    mine = _fields(gguf, made)
    tok = sorted(k for k in vocab if k.startswith("tokenizer."))
    assert "tokenizer.chat_template" in tok and "tokenizer.ggml.tokens" in tok
    assert {k: mine[k] for k in tok} == {k: vocab[k] for k in tok}


def test_the_header_is_a_small_llama(made: Path) -> None:
    info = parse_info(made)
    assert (info.architecture, info.block_count, info.is_moe) == ("llama", 4, False)
    assert info.kv_bytes_per_token() == 4 * 2 * 2 * 64 * 2  # layers x K,V x kv heads x dim x f16
