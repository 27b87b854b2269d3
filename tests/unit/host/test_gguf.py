"""GGUF header parsing and the sha256 cache (synthetic files; no model needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from batch_invariance.errors import UsageError
from batch_invariance.host.facts import cached_sha256, sha256_file
from batch_invariance.host.gguf import parse_info, read_metadata
from tests.support.fakes_live import dense_meta, write_gguf


def test_dense_model_geometry(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", dense_meta())
    info = parse_info(path)
    assert info.architecture == "gemma3"
    assert info.block_count == 18
    assert info.kv_heads_total == 18  # one KV head x 18 layers
    assert (info.key_length, info.value_length) == (256, 256)
    assert info.expert_count == 0 and info.is_moe is False
    assert info.sliding_window == 512
    assert info.file_size == path.stat().st_size
    # f16 K and V: 18 heads x (256 + 256) x 2 bytes per token.
    assert info.kv_bytes_per_token() == 18 * 512 * 2
    assert info.kv_bytes_per_token("q8_0", "q8_0") == pytest.approx(18 * 512 * 34 / 32)


def test_moe_is_read_from_the_file_not_the_name(tmp_path: Path) -> None:
    meta = dense_meta(**{"gemma3.expert_count": 8, "general.name": "dense-sounding name"})
    info = parse_info(write_gguf(tmp_path / "dense.gguf", meta))
    assert info.is_moe is True
    assert info.summary()["expert_count"] == 8


def test_per_layer_kv_heads_and_default_head_dim(tmp_path: Path) -> None:
    meta = dense_meta()
    del meta["gemma3.attention.key_length"]
    del meta["gemma3.attention.value_length"]
    meta["gemma3.attention.head_count_kv"] = [1, 2, 0] + [1] * 15
    info = parse_info(write_gguf(tmp_path / "m.gguf", meta))
    assert info.kv_heads_total == 1 + 2 + 0 + 15
    assert info.key_length == 640 // 4


def test_tokenizer_tables_are_skipped(tmp_path: Path) -> None:
    _, meta = read_metadata(write_gguf(tmp_path / "m.gguf", dense_meta()))
    assert "tokenizer.ggml.tokens" not in meta
    assert meta["gemma3.block_count"] == 18


def test_not_a_gguf_is_a_usage_error(tmp_path: Path) -> None:
    bad = write_gguf(tmp_path / "bad.gguf", dense_meta(), magic=b"GGML")
    with pytest.raises(UsageError, match="not a GGUF"):
        parse_info(bad)
    with pytest.raises(UsageError, match="cannot read model"):
        parse_info(tmp_path / "missing.gguf")


def test_truncated_header_is_a_usage_error(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", dense_meta(), padding=0)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(UsageError, match="unreadable GGUF header"):
        parse_info(path)


def test_missing_architecture_keys(tmp_path: Path) -> None:
    meta = dense_meta()
    del meta["gemma3.block_count"]
    with pytest.raises(UsageError, match="block_count"):
        parse_info(write_gguf(tmp_path / "m.gguf", meta))
    with pytest.raises(UsageError, match=r"general\.architecture"):
        parse_info(write_gguf(tmp_path / "n.gguf", {"general.name": "x"}))


def test_sha256_cache_reuses_while_size_and_mtime_hold(tmp_path: Path) -> None:
    model = tmp_path / "m.bin"
    model.write_bytes(b"abc" * 1000)
    cache = tmp_path / "hashes.json"
    real = sha256_file(model)
    assert cached_sha256(model, cache) == real
    # Plant a different value under the same size+mtime: proof that the cache is used.
    table = json.loads(cache.read_text())
    table[str(model.resolve())]["sha256"] = "0" * 64
    cache.write_text(json.dumps(table))
    assert cached_sha256(model, cache) == "0" * 64
    # A changed mtime invalidates the entry.
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert cached_sha256(model, cache) == real


def test_sha256_cache_survives_a_corrupt_cache_file(tmp_path: Path) -> None:
    model = tmp_path / "m.bin"
    model.write_bytes(b"x")
    cache = tmp_path / "hashes.json"
    cache.write_text("{not json")
    assert cached_sha256(model, cache) == sha256_file(model)
    assert cached_sha256(model, None) == sha256_file(model)


def test_chat_template_is_read_and_a_base_model_has_none(tmp_path: Path) -> None:
    template = "{% for m in messages %}<start_of_turn>{{ m.content }}{% endfor %}"
    meta = dense_meta(**{"tokenizer.chat_template": template})
    assert parse_info(write_gguf(tmp_path / "it.gguf", meta)).chat_template == template
    # A base model: no key at all, or an empty one, reads as "no template of its own".
    assert parse_info(write_gguf(tmp_path / "base.gguf", dense_meta())).chat_template is None
    blank = dense_meta(**{"tokenizer.chat_template": "  "})
    assert parse_info(write_gguf(tmp_path / "blank.gguf", blank)).chat_template is None
    # The template is the one tokenizer key kept; the tables are still skipped.
    _, kept = read_metadata(write_gguf(tmp_path / "it2.gguf", meta))
    assert "tokenizer.ggml.tokens" not in kept and kept["tokenizer.chat_template"] == template
