"""One prompt to measure: the unit every arm sends and every scorer judges."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "REP_SEPARATOR",
    "WorkItem",
    "duplicate_prompts",
    "normalise_whitespace",
    "prompt_text",
    "rep_id",
    "request_key",
    "row_id",
]


#: Repetitions of one work-set row get ids ``{row id}{REP_SEPARATOR}{k}``.
REP_SEPARATOR = "#r"


def rep_id(row: str, k: int) -> str:
    """The test id of repetition ``k`` of work-set row ``row``."""
    return f"{row}{REP_SEPARATOR}{k}"


def row_id(test_id: str) -> str:
    """The work-set row a test id repeats (the id without its ``#rK`` suffix).

    Repetitions of one prompt are not independent samples: where a cert carries no request
    keys, the per-prompt bound counts rows. An id that only looks like a repetition is folded
    too, which can only under-count rows.
    """
    head, sep, tail = test_id.rpartition(REP_SEPARATOR)
    return head if sep and head and tail.isdigit() else test_id


def normalise_whitespace(text: str) -> str:
    """``text`` with every run of whitespace one space and none at either end: two prompts
    that differ only there are one prompt, not two independent samples."""
    return " ".join(text.split())


def _normalised(value: Any) -> Any:
    if isinstance(value, str):
        return normalise_whitespace(value)
    if isinstance(value, Mapping):
        return {str(k): _normalised(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalised(v) for v in value]
    return value


def request_key(path: str, body: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of one request as the server sees it: the endpoint ``path`` and the
    JSON ``body`` (prompt or messages, token budget, stop, sampling fields), every string
    whitespace-normalised. Two ids with one key are one distinct prompt. The caller leaves out
    what differs per id or per arm without changing what is asked (the per-id seed, which
    greedy decoding ignores, and the logprob fields)."""
    text = json.dumps(_normalised(body), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(f"{path}\n{text}".encode()).hexdigest()


@dataclass(frozen=True)
class WorkItem:
    """One prompt to measure, with what the scorer needs to judge it."""

    test_id: str
    prompt: str | None
    messages: tuple[tuple[str, str], ...] | None
    expected_answer: str | None = None
    family: str | None = None
    fill: float | None = None
    system: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def with_id(self, test_id: str) -> WorkItem:
        """The same item under another test id (used for repetitions)."""
        return WorkItem(
            test_id=test_id,
            prompt=self.prompt,
            messages=self.messages,
            expected_answer=self.expected_answer,
            family=self.family,
            fill=self.fill,
            system=self.system,
            meta=self.meta,
        )


def prompt_text(item: WorkItem) -> str:
    """The item's prompt as one whitespace-normalised text (system, then the prompt or each
    message with its role): the work-set's own notion of "the same prompt"."""
    parts = [] if item.system is None else [f"system: {item.system}"]
    if item.messages is not None:
        parts.extend(f"{role}: {content}" for role, content in item.messages)
    else:
        parts.append(f"prompt: {item.prompt or ''}")
    return normalise_whitespace("\n".join(parts))


def duplicate_prompts(items: Sequence[WorkItem]) -> tuple[tuple[str, ...], ...]:
    """Groups of ids (in work-set order) whose rows carry the same prompt, whitespace aside;
    repetitions of one row (``#rK``) are one row, not duplicates. Empty when every row is
    distinct."""
    by_text: dict[str, list[str]] = {}
    for item in items:
        ids = by_text.setdefault(prompt_text(item), [])
        if row_id(item.test_id) not in map(row_id, ids):
            ids.append(item.test_id)
    return tuple(tuple(ids) for ids in by_text.values() if len(ids) > 1)
