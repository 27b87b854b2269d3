"""The Action's ``endpoint`` input: ``auto`` sends a base model (a GGUF without a chat
template of its own) raw completions, and every other model the chat endpoint."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from batch_invariance.action import inputs as action_inputs
from batch_invariance.action.entrypoint import refuse_unreachable
from batch_invariance.action.inputs import live_request, read_inputs
from batch_invariance.errors import UsageError
from batch_invariance.service.live import prepare
from tests.support.fakes_live import dense_meta, fake_server, write_gguf

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def test_auto_picks_completions_for_a_base_model_and_chat_for_a_templated_one(
    tmp_path: Path,
) -> None:
    """The Action decides ``auto`` as the CLI does: it hands the input to the request, and
    the service's one rule (service/endpoint.py) reads the model it launches."""
    write_gguf(tmp_path / "base.gguf", dense_meta())
    write_gguf(tmp_path / "chat.gguf", dense_meta(**{"tokenizer.chat_template": TEMPLATE}))
    fake_server(tmp_path / "bin")
    env = {"GITHUB_WORKSPACE": str(tmp_path), "INPUT_SERVER-BIN": "bin/llama-server"}

    def endpoint(model: str, given: str = "") -> str:
        inputs = read_inputs({**env, "INPUT_MODEL": model, "INPUT_ENDPOINT": given})
        request = live_request(inputs, None)
        assert request.endpoint == (given or "auto")
        return prepare(request, create_out_dir=False).measurement.endpoint

    assert endpoint("base.gguf") == "completions"
    assert endpoint("chat.gguf") == "chat"
    # Said outright, the input wins.
    assert endpoint("base.gguf", "chat") == "chat"
    assert endpoint("chat.gguf", "completions") == "completions"
    assert not hasattr(action_inputs, "resolve_endpoint")  # one rule, in the service
    # The plan step of the job log says what auto chose, and why.
    inputs = read_inputs({**env, "INPUT_MODEL": "base.gguf"})
    log = io.StringIO()
    refuse_unreachable(prepare(live_request(inputs, None), create_out_dir=False), "green", log)
    assert "batch-invariance: plan: endpoint: completions (auto: the model has no chat" in (
        log.getvalue()
    )


def test_the_input_takes_three_words(tmp_path: Path) -> None:
    env = {"GITHUB_WORKSPACE": str(tmp_path)}
    assert read_inputs(env).endpoint == "auto"
    assert read_inputs({**env, "INPUT_ENDPOINT": " Completions "}).endpoint == "completions"
    with pytest.raises(UsageError, match="input endpoint must be auto, chat or completions"):
        read_inputs({**env, "INPUT_ENDPOINT": "raw"})
