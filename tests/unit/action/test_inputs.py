"""The Action's ``endpoint`` input: ``auto`` sends a base model (a GGUF without a chat
template of its own) raw completions, and every other model the chat endpoint."""

from __future__ import annotations

import io
import re
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


def test_the_deploy_cell_inputs_become_run_lives_options(tmp_path: Path) -> None:
    """kv-layout, cache-arm and cache-ram are run-live's --kv-layout, --cache-arm and
    --cache-ram, read into the same request; engine-env is the variables a shell prefix gives
    run-live (the entrypoint sets them for the servers it starts)."""
    from dataclasses import replace

    from batch_invariance.cli import build_parser
    from batch_invariance.commands.cell_options import request_from_args

    env = {
        "GITHUB_WORKSPACE": str(tmp_path),
        "INPUT_SERVER-BIN": "bin/llama-server",
        "INPUT_MODEL": "m.gguf",
        "INPUT_KV-LAYOUT": "unified",
        "INPUT_CACHE-ARM": "true",
        "INPUT_CACHE-RAM": "1024",
        "INPUT_ENGINE-ENV": "GGML_SCHED_MAX_COPIES=1\n\nLD_LIBRARY_PATH=/opt/cuda/lib64\n",
    }
    inputs = read_inputs(env)
    assert inputs.engine_env == (
        ("GGML_SCHED_MAX_COPIES", "1"), ("LD_LIBRARY_PATH", "/opt/cuda/lib64"),
    )  # fmt: skip
    args = build_parser().parse_args(
        ["run-live", "--server-bin", str(tmp_path / "bin/llama-server"), "--model",
         str(tmp_path / "m.gguf"), "--ctx", "2048", "--parallel", "4", "--out-dir",
         str(tmp_path / "batch-invariance-certs"), "--kv-layout", "unified", "--cache-arm",
         "--cache-ram", "1024"]
    )  # fmt: skip
    from_cli = request_from_args(args)
    stop = replace(from_cli.measurement, stop_on_red=True)
    assert live_request(inputs, None) == replace(from_cli, measurement=stop)
    defaults = read_inputs({"GITHUB_WORKSPACE": str(tmp_path)})
    assert (defaults.kv_layout, defaults.engine_env, defaults.cache_arm) == ("split", (), False)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("kv-layout", "paged", "input kv-layout must be split or unified"),
        ("cache-ram", "lots", "input cache-ram must be an integer"),
        ("cache-arm", "maybe", "input cache-arm must be true or false"),
        ("engine-env", "GGML_X", "'GGML_X' is not one NAME=VALUE of its own"),
        ("engine-env", "GGML_X=1\nGGML_X=2", "'GGML_X=2' is not one NAME=VALUE of its own"),
        # Not read by llama-server, its options (compared as server-flags), GPU placement.
        ("engine-env", "PYTHONPATH=/x", "PYTHONPATH is not a variable llama-server reads"),
        ("engine-env", "LLAMA_ARG_CTX_SIZE=4096", "LLAMA_ARG_CTX_SIZE is not a variable"),
        ("engine-env", "CUDA_VISIBLE_DEVICES=1", "CUDA_VISIBLE_DEVICES is not a variable"),
    ],
)
def test_a_bad_deploy_cell_input_is_refused_by_name(name: str, value: str, says: str) -> None:
    env = {"GITHUB_WORKSPACE": "/w", f"INPUT_{name.upper()}": value}
    with pytest.raises(UsageError, match=re.escape(says)):
        read_inputs(env)


def test_the_cache_ram_goes_with_the_cache_arm(tmp_path: Path) -> None:
    env = {"GITHUB_WORKSPACE": str(tmp_path), "INPUT_CACHE-RAM": "1024"}
    with pytest.raises(UsageError, match="--cache-ram sets the prompt-cache arm's server"):
        live_request(read_inputs(env), None).check()
