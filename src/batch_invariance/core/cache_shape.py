"""The prompt-cache work-set shape (pure): any work-set turned into the traffic a prompt cache
serves, so that the prompt-cache arm really reuses cached tokens.

Two kinds of reuse, as deployed clients cause them:

* a **shared preamble**: every row starts with the same :data:`PREAMBLE` (a system prompt, or
  its text ahead of a raw completion prompt), so every request after the first can reuse it;
* **multi-turn conversations**: rows are grouped ``turns`` at a time into one conversation
  whose later turns extend the earlier ones (turn k's prompt is turn k-1's, then a fixed
  assistant reply, then row k's own prompt), so a later turn reuses all of an earlier one.

Rows come out turn-major (every conversation's first turn, then every second turn, ...), so a
conversation's earlier turn has been answered before its later one is sent in order. Ids,
expected answers and families are the rows' own; ``meta`` says the conversation and turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from batch_invariance.core.workitem import WorkItem, row_id

__all__ = ["ASSISTANT_TURN", "DEFAULT_TURNS", "PREAMBLE", "cache_shaped", "conversation_chains"]

DEFAULT_TURNS = 3

#: The shared preamble (about 120 tokens on a Gemma tokenizer).
PREAMBLE = (
    "You are a careful writing assistant for a small public library. The library runs a "
    "weekly storytelling evening for children and adults, and its volunteers collect short "
    "openings that visitors start and the assistant continues. Keep the tone warm and plain, "
    "avoid lists, headings and markup, and write in full sentences that a ten-year-old can "
    "read aloud. Stay with the characters and places the opening introduces, do not add a "
    "moral at the end, and never address the reader directly. If an opening is unfinished, "
    "carry on from its last word as if you had written it yourself, keeping its tense and "
    "its point of view."
)
#: What stands for the assistant's earlier answer between two turns (a fixed text, so every
#: arm sends the same bytes).
ASSISTANT_TURN = "Thank you, I have noted that. Please give me the next opening."


def _text(item: WorkItem) -> str:
    """The row's own request as one text: its prompt, or its last user message."""
    if item.prompt is not None:
        return item.prompt
    users = [c for r, c in item.messages or () if r == "user"]
    return users[-1] if users else ""


def _turn(conversation: Sequence[WorkItem], k: int, index: int, chat: bool) -> WorkItem:
    item = conversation[k]
    meta = {**item.meta, "conversation": index, "turn": k + 1}
    if chat:
        messages: list[tuple[str, str]] = [("system", PREAMBLE)]
        for earlier in conversation[:k]:
            messages += [("user", _text(earlier)), ("assistant", ASSISTANT_TURN)]
        messages.append(("user", _text(item)))
        return replace(item, prompt=None, messages=tuple(messages), system=None, meta=meta)
    parts = [PREAMBLE]
    for earlier in conversation[:k]:
        parts += [_text(earlier), ASSISTANT_TURN]
    parts.append(_text(item))
    return replace(item, prompt="\n\n".join(parts), messages=None, system=None, meta=meta)


def cache_shaped(items: Sequence[WorkItem], turns: int = DEFAULT_TURNS) -> tuple[WorkItem, ...]:
    """``items`` as conversations of ``turns`` rows behind the shared preamble, turn-major.
    Rows with ``messages`` become chat conversations; prompt rows stay prompts."""
    if turns < 1:
        raise ValueError(f"turns must be at least 1 (got {turns})")
    conversations = [items[i : i + turns] for i in range(0, len(items), turns)]
    shaped: list[WorkItem] = []
    for k in range(turns):
        for index, conversation in enumerate(conversations):
            if k < len(conversation):
                chat = any(i.messages is not None for i in conversation)
                shaped.append(_turn(conversation, k, index, chat))
    return tuple(shaped)


def conversation_chains(items: Sequence[WorkItem]) -> tuple[tuple[str, ...], ...]:
    """The test ids of ``items`` grouped into the chains one client sends one after another:
    each conversation (per repetition) in turn order; a row outside any conversation is a
    chain of its own. Chains keep the order of their first row.

    Why: a later turn can only reuse its earlier turn once that turn has been answered, and
    only where the slot that answered it is idle. On a sliding-window model (Gemma 3) with
    llama-server's defaults a request that shares only the preamble with a slot's cache
    reuses nothing (no context checkpoint inside the shared part), so a turn sent while its
    earlier turn is still in flight is evaluated cold."""
    chains: dict[object, list[tuple[int, int, str]]] = {}
    for position, item in enumerate(items):
        conversation = item.meta.get("conversation")
        rep = item.test_id[len(row_id(item.test_id)) :]
        key: object = ("row", item.test_id) if conversation is None else (conversation, rep)
        turn = item.meta.get("turn", 0)
        chains.setdefault(key, []).append(
            (turn if isinstance(turn, int) else 0, position, item.test_id)
        )
    return tuple(tuple(test_id for _, _, test_id in sorted(chain)) for chain in chains.values())
