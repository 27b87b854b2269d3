"""Which endpoint a live cell's requests go to: the one place it is decided.

``--endpoint`` (``run-live``, ``demo``, ``sweep``) and the Action's ``endpoint`` input take
``chat``, ``completions`` or ``auto``. ``auto`` sends raw completions to a base model (a GGUF
without a chat template of its own, which llama-server would wrap in its ChatML fallback on
the chat endpoint, so the answers would measure that fallback) and the chat endpoint to every
other model. What ``auto`` reads:

* a chat template given outright (``--server-flag --chat-template NAME``): chat;
* a GGUF header (a launched GGUF model, or the ``--model`` file named beside ``--base-url``):
  chat when it has a template, completions when it has none;
* nothing to read (an attached server without a model file, a Hugging Face model folder, a
  file this host cannot read): chat, the endpoint every chat model answers on.

:class:`ChosenEndpoint` keeps the reason, which the dry run, the banner and the Action's log
print, so a plan never hides which endpoint ``auto`` took.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from batch_invariance.core.chat_template import sets_template
from batch_invariance.core.plan import Endpoint
from batch_invariance.errors import UsageError
from batch_invariance.host.gguf import GgufInfo, parse_info

__all__ = [
    "ENDPOINT_CHOICES",
    "ChosenEndpoint",
    "EndpointChoice",
    "choose_endpoint",
    "header_of",
]

#: What ``--endpoint`` and the Action's ``endpoint`` input take.
EndpointChoice = Literal["auto", "chat", "completions"]
ENDPOINT_CHOICES: tuple[EndpointChoice, ...] = ("auto", "chat", "completions")


@dataclass(frozen=True)
class ChosenEndpoint:
    """The endpoint a cell uses and, where ``auto`` chose it, why (``None``: given outright)."""

    endpoint: Endpoint
    why: str | None = None

    def line(self) -> str:
        """``endpoint: completions (auto: ...)``, or ``endpoint: chat`` when given outright."""
        return f"endpoint: {self.endpoint}" + (f" (auto: {self.why})" if self.why else "")


def header_of(model: Path | None) -> GgufInfo | None:
    """The GGUF header of ``model`` where it is a readable GGUF file here (``None``: not one,
    or unreadable; the launch, where there is one, names the problem)."""
    if model is None or model.suffix != ".gguf" or not model.is_file():
        return None
    try:
        return parse_info(model)
    except (OSError, ValueError, UsageError):
        return None


def choose_endpoint(
    choice: EndpointChoice,
    *,
    header: GgufInfo | None,
    attached: bool = False,
    server_flags: Sequence[str] = (),
) -> ChosenEndpoint:
    """The endpoint ``choice`` means for a model whose GGUF header is ``header`` (``None``: none
    read), on an attached server or a launched one started with ``server_flags``."""
    if choice != "auto":
        return ChosenEndpoint(choice)
    if sets_template(server_flags):
        return ChosenEndpoint(
            "chat", "a server flag names the chat template (--chat-template or -file)"
        )
    if header is not None:
        if header.chat_template:
            return ChosenEndpoint("chat", "the model has its own chat template")
        return ChosenEndpoint(
            "completions",
            "the model has no chat template of its own (a base model): on chat the server "
            "would wrap it in its ChatML fallback",
        )
    if attached:
        return ChosenEndpoint(
            "chat",
            "an attached server with no model file to read here: chat, with the template the "
            "server was started with; give --endpoint completions for a base model",
        )
    return ChosenEndpoint(
        "chat", "no GGUF header to read a chat template from: the engine applies the model's own"
    )
