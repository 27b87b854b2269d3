"""``--endpoint auto`` (the Action's ``endpoint: auto``): one rule, decided when the request is
checked. A GGUF without a chat template of its own (a base model) gets raw completions, every
other model the chat endpoint; an attached server with no model file to read gets chat. The
job keeps the reason, which the dry run, the banner and the Action's log print."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance.host.gguf import parse_info
from batch_invariance.service.endpoint import ChosenEndpoint, choose_endpoint, header_of
from batch_invariance.service.live import prepare
from batch_invariance.service.request import (
    ACTION_DEFAULTS,
    RUN_LIVE_DEFAULTS,
    SWEEP_DEFAULTS,
    AttachRequest,
    LiveRequest,
)
from tests.support.fakes_live import dense_meta, fake_server, write_gguf

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


@pytest.fixture()
def models(tmp_path: Path) -> dict[str, Path]:
    return {
        "base": write_gguf(tmp_path / "base.gguf", dense_meta()),
        "chat": write_gguf(
            tmp_path / "chat.gguf", dense_meta(**{"tokenizer.chat_template": TEMPLATE})
        ),
    }


def test_auto_reads_the_header_for_a_chat_template(models: dict[str, Path]) -> None:
    base = choose_endpoint("auto", header=parse_info(models["base"]))
    assert base.endpoint == "completions"
    assert base.why is not None and "no chat template of its own (a base model)" in base.why
    assert base.line().startswith("endpoint: completions (auto: the model has no chat template")
    chat = choose_endpoint("auto", header=parse_info(models["chat"]))
    assert chat == ChosenEndpoint("chat", "the model has its own chat template")


def test_said_outright_the_endpoint_wins_and_needs_no_reason(models: dict[str, Path]) -> None:
    base, chat = parse_info(models["base"]), parse_info(models["chat"])
    assert choose_endpoint("chat", header=base) == ChosenEndpoint("chat")
    assert choose_endpoint("completions", header=chat) == ChosenEndpoint("completions")
    assert ChosenEndpoint("chat").line() == "endpoint: chat"


def test_a_template_named_by_a_server_flag_means_chat(models: dict[str, Path]) -> None:
    base = parse_info(models["base"])
    for flags in (("--chat-template", "chatml"), ("--chat-template-file=t.jinja",)):
        chosen = choose_endpoint("auto", header=base, server_flags=flags)
        assert chosen.endpoint == "chat" and "server flag" in str(chosen.why)


def test_nothing_to_read_means_chat(tmp_path: Path) -> None:
    attached = choose_endpoint("auto", header=None, attached=True)
    assert attached.endpoint == "chat" and "attached server" in str(attached.why)
    folder = choose_endpoint("auto", header=None)
    assert folder.endpoint == "chat" and "no GGUF header" in str(folder.why)
    # Not a GGUF, missing, or not a readable header: nothing read.
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    for path in (None, tmp_path / "model.safetensors", tmp_path / "missing.gguf",
                 tmp_path / "junk.gguf"):  # fmt: skip
        assert header_of(path) is None


def test_run_live_sweep_and_the_action_default_to_auto() -> None:
    assert RUN_LIVE_DEFAULTS.endpoint == SWEEP_DEFAULTS.endpoint == "auto"
    assert ACTION_DEFAULTS.endpoint == "auto"


def _launched(tmp_path: Path, model: Path, **over: object) -> LiveRequest:
    return LiveRequest(
        tmp_path / "out",
        server_bin=fake_server(tmp_path / "bin"),
        model=model,
        ctx=512,
        parallel=2,
        **over,  # type: ignore[arg-type]
    )


def test_prepare_decides_auto_from_the_launched_model(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    base = prepare(_launched(tmp_path, models["base"], endpoint="auto"), create_out_dir=False)
    assert base.measurement.endpoint == "completions"
    assert base.endpoint is not None and base.endpoint.why is not None
    chat = prepare(_launched(tmp_path, models["chat"], endpoint="auto"), create_out_dir=False)
    assert chat.measurement.endpoint == "chat"
    # A template given to the server: chat, whatever the header says.
    flagged = _launched(
        tmp_path, models["base"], endpoint="auto", server_flags=("--chat-template", "chatml")
    )
    assert prepare(flagged, create_out_dir=False).measurement.endpoint == "chat"
    # Said outright: that endpoint, no reason; unsaid (None): the measurement's own.
    said = prepare(_launched(tmp_path, models["base"], endpoint="chat"), create_out_dir=False)
    assert said.measurement.endpoint == "chat" and said.endpoint == ChosenEndpoint("chat")
    unsaid = prepare(_launched(tmp_path, models["base"]), create_out_dir=False)
    assert unsaid.measurement.endpoint == RUN_LIVE_DEFAULTS.measurement.endpoint


def test_prepare_on_an_attached_server(tmp_path: Path, models: dict[str, Path]) -> None:
    attach = AttachRequest(base_url="http://127.0.0.1:9")
    request = LiveRequest(tmp_path / "out", ctx=512, parallel=2, attach=attach, endpoint="auto")
    job = prepare(request, create_out_dir=False)
    assert job.measurement.endpoint == "chat"
    assert job.endpoint is not None and "attached server" in str(job.endpoint.why)
    # The GGUF named beside --base-url is read: a base model gets completions.
    named = prepare(
        LiveRequest(tmp_path / "out", model=models["base"], ctx=512, parallel=2, attach=attach,
                    endpoint="auto"),
        create_out_dir=False,
    )  # fmt: skip
    assert named.measurement.endpoint == "completions"
