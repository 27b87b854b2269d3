"""The Action's ``endpoint`` input: ``auto`` sends a base model (a GGUF without a chat
template of its own) raw completions, and every other model the chat endpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance.action.inputs import read_inputs, resolve_endpoint
from batch_invariance.errors import UsageError
from tests.support.fakes_live import dense_meta, write_gguf

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def test_auto_picks_completions_for_a_base_model_and_chat_for_a_templated_one(
    tmp_path: Path,
) -> None:
    base = write_gguf(tmp_path / "base.gguf", dense_meta())
    chat = write_gguf(tmp_path / "chat.gguf", dense_meta(**{"tokenizer.chat_template": TEMPLATE}))
    assert resolve_endpoint("auto", "llama-server", base) == "completions"
    assert resolve_endpoint("auto", "llama-server", chat) == "chat"
    # Said outright, the input wins; another engine's model folder, or a file that cannot be
    # read here, gets the chat endpoint (the launch names an unreadable model).
    assert resolve_endpoint("chat", "llama-server", base) == "chat"
    assert resolve_endpoint("completions", "llama-server", chat) == "completions"
    assert resolve_endpoint("auto", "vllm", tmp_path / "model.safetensors") == "chat"
    assert resolve_endpoint("auto", "llama-server", tmp_path / "missing.gguf") == "chat"


def test_the_input_takes_three_words(tmp_path: Path) -> None:
    env = {"GITHUB_WORKSPACE": str(tmp_path)}
    assert read_inputs(env).endpoint == "auto"
    assert read_inputs({**env, "INPUT_ENDPOINT": " Completions "}).endpoint == "completions"
    with pytest.raises(UsageError, match="input endpoint must be auto, chat or completions"):
        read_inputs({**env, "INPUT_ENDPOINT": "raw"})
