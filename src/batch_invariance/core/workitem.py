"""One prompt to measure: the unit every arm sends and every scorer judges."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import not_
from typing import Any

#: Repetitions of one work-set row get ids ``{row id}{REP_SEPARATOR}{k}``.
REP_SEPARATOR = "#r"


def rep_id(row: str, k: int) -> str:
    """The test id of repetition ``k`` of work-set row ``row``."""
    return f"{row}{REP_SEPARATOR}{k}"


def row_id(test_id: str) -> str:
    """The work-set row a test id repeats (the id without its ``#rK`` suffix).

    Repetitions of one prompt are not independent samples: the per-prompt bound counts rows.
    An id that only looks like a repetition is folded too, which can only under-count rows.
    """
    head, sep, tail = test_id.rpartition(REP_SEPARATOR)
    return head if sep and head and tail.isdigit() else test_id


def row_ids(test_ids: Iterable[str]) -> set[str]:
    """The distinct :func:`row_id` of ``test_ids``. Only ids holding the separator can fold,
    so the others are taken as they are without a call each."""
    listed = list(test_ids)
    holds = list(map(str.__contains__, listed, repeat(REP_SEPARATOR)))
    rows = set(compress(listed, map(not_, holds)))
    rows.update(map(row_id, compress(listed, holds)))
    return rows


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
