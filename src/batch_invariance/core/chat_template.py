"""Which chat template shaped the chat requests of a cell, and whether to warn about it.

A base model (the embedded Gemma 3 270M, for one) carries no ``tokenizer.chat_template``.
On ``/v1/chat/completions`` an engine may then silently fall back to a built-in template (the
engine says which: :class:`ChatFallback`; llama.cpp's is ChatML), and the model answers
with junk such as ``<|im_end|>\\n<|im_start|>``. The verdict is still a fact about the
server, but the answers are not what anyone deploys: the cert and the banner say so and name
the fixes.

Pure: the caller reads the model's template (GGUF header), the server's (``GET /props``,
``chat_template``) and the server argv, and passes them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from batch_invariance.core.plan import WorkItem

__all__ = [
    "FIXES",
    "NO_FALLBACK",
    "TEMPLATE_FLAGS",
    "ChatFallback",
    "ChatTemplateCheck",
    "ChatTemplateSource",
    "fallback_warning",
    "judge_chat_template",
    "sends_chat",
    "sets_template",
]


ChatTemplateSource = Literal["model", "server_flag", "server_fallback", "unknown", "not_used"]

#: Server flags that pick the template explicitly (the operator's choice: nothing to warn).
TEMPLATE_FLAGS = ("--chat-template", "--chat-template-file")

FIXES = (
    "send completion-style prompts with --endpoint completions, or pick a template with "
    "--server-flag --chat-template NAME"
)


def fallback_warning(server: str) -> str:
    """The warning of a cell whose chat requests ``server`` wrapped in its built-in template."""
    return (
        f"the model has no chat template of its own: {server} wrapped every chat request in "
        "its ChatML fallback, so the answers may be junk; " + FIXES
    )


@dataclass(frozen=True)
class ChatFallback:
    """An engine's built-in chat template for a model with none ("": none known), and the
    engine's name (what the warning names)."""

    server: str = "the server"
    template: str = ""


#: No engine's fallback known.
NO_FALLBACK = ChatFallback()


@dataclass(frozen=True)
class ChatTemplateCheck:
    """Where the chat template came from; ``warning`` is set when answers may be junk."""

    source: ChatTemplateSource
    warning: str | None

    def to_record(self) -> dict[str, Any]:
        return {"source": self.source, "warning": self.warning}


def sends_chat(endpoint: str, items: Iterable[WorkItem]) -> bool:
    """Whether any of ``items`` goes to the chat endpoint (rows with messages always do)."""
    return endpoint == "chat" or any(item.messages is not None for item in items)


def sets_template(server_argv: Sequence[str]) -> bool:
    """Whether the argv names a template (``--chat-template X`` or ``--chat-template=X``)."""
    return any(arg.split("=", 1)[0] in TEMPLATE_FLAGS for arg in server_argv)


def judge_chat_template(
    *,
    uses_chat: bool,
    server_argv: Sequence[str],
    server_template: str | None,
    fallback: ChatFallback,
    model_read: bool = False,
    model_template: str | None = None,
) -> ChatTemplateCheck:
    """The :class:`ChatTemplateCheck` of a cell.

    ``model_read`` says the model file's header was read (``model_template`` is then what it
    carries, ``None`` for none). Without it, the server's own report decides: its built-in
    fallback text (``fallback.template``, the engine's own) means the model had none; any
    other template is taken as the model's.
    """
    warning = fallback_warning(fallback.server)
    if not uses_chat:
        return ChatTemplateCheck("not_used", None)
    if sets_template(server_argv):
        return ChatTemplateCheck("server_flag", None)
    if model_read:
        if model_template:
            return ChatTemplateCheck("model", None)
        return ChatTemplateCheck("server_fallback", warning)
    if server_template is None:
        return ChatTemplateCheck("unknown", None)
    if server_template.strip() == fallback.template.strip():
        return ChatTemplateCheck("server_fallback", warning)
    return ChatTemplateCheck("model", None)
