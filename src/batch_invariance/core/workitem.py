"""One prompt to measure: the unit every arm sends and every scorer judges."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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
