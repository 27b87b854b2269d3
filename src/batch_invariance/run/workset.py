"""Work-sets: the prompts a cell is measured on.

A work-set file is a JSON list of rows ``{id?, prompt | messages, expected_answer?, family?,
fill?, system?}``; any other keys are kept in :attr:`WorkItem.meta` for the scorer. Rows are
validated with pydantic at this edge and become frozen :class:`WorkItem` values inside.
Rows that carry the same prompt (whitespace aside) are named when the work-set is read: one
warning line on stderr, and :attr:`Workset.duplicates`, which the cert's provenance records.
They count as one distinct prompt (:func:`batch_invariance.core.sample.distinct_prompts`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from batch_invariance.core.cache_arm import cache_shaped
from batch_invariance.core.plan import WorkItem, duplicate_prompts, rep_id
from batch_invariance.errors import UsageError

__all__ = [
    "BUNDLED_WORKSETS",
    "ChatMessage",
    "WorkRow",
    "Workset",
    "bundled_workset_path",
    "expand_reps",
    "items_to_row",
    "load_workset",
    "parse_workset",
    "shaped_for_cache",
    "workset_from_items",
]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    role: Literal["system", "user", "assistant"]
    content: str


class WorkRow(BaseModel):
    """One row of a work-set file, as written on disk."""

    model_config = ConfigDict(extra="allow")
    id: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    expected_answer: str | None = None
    family: str | None = None
    fill: float | None = None
    system: str | None = None

    @model_validator(mode="after")
    def _one_of_prompt_or_messages(self) -> WorkRow:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of 'prompt' or 'messages' is required")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' must not be empty")
        if self.id is not None and not self.id.strip():
            raise ValueError("'id' must not be blank")
        return self


@dataclass(frozen=True)
class Workset:
    """A validated work-set and the sha256 of the bytes it was read from."""

    items: tuple[WorkItem, ...]
    sha256: str
    source: str
    #: Groups of ids whose rows carry the same prompt, whitespace aside (one distinct prompt).
    duplicates: tuple[tuple[str, ...], ...] = ()

    def record(self) -> dict[str, Any]:
        """The work-set as the cert's provenance records it."""
        return {
            "source": self.source,
            "sha256": self.sha256,
            "n_rows": len(self.items),
            "duplicate_prompts": [list(group) for group in self.duplicates],
        }


def duplicates_warning(workset: Workset) -> str | None:
    """The one warning line naming rows that carry the same prompt, or ``None``. A line break
    in an id or the source is written as ``\\n`` (the line is the job log's in the Action:
    no value may start a line of its own there)."""
    groups = workset.duplicates
    if not groups:
        return None
    n_rows = sum(map(len, groups))
    shown = "; ".join(
        ", ".join(group[:4]) + (" ..." if len(group) > 4 else "") for group in groups[:3]
    )
    more = f" (+{len(groups) - 3} more group(s))" if len(groups) > 3 else ""
    line = (
        f"warning: work-set {workset.source}: {n_rows} rows carry only {len(groups)} distinct "
        f"prompt(s) between them (whitespace aside): {shown}{more}; each group counts as one "
        "distinct prompt for the per-prompt bound"
    )
    return line.replace("\r", "\\r").replace("\n", "\\n")


def _named(workset: Workset) -> Workset:
    found = replace(workset, duplicates=duplicate_prompts(workset.items))
    warning = duplicates_warning(found)
    if warning is not None:
        print(warning, file=sys.stderr)
    return found


def _item_from_row(index: int, row: WorkRow) -> WorkItem:
    extra = dict(row.model_extra or {})
    return WorkItem(
        test_id=row.id if row.id is not None else f"row{index:04d}",
        prompt=row.prompt,
        messages=(
            tuple((m.role, m.content) for m in row.messages) if row.messages is not None else None
        ),
        expected_answer=row.expected_answer,
        family=row.family,
        fill=row.fill,
        system=row.system,
        meta=extra,
    )


def parse_workset(data: Any, source: str = "<memory>", sha256: str = "") -> Workset:
    """Validate decoded JSON as a work-set.

    Raises :class:`UsageError` naming the first bad row, or the first duplicate id.
    """
    if not isinstance(data, list) or not data:
        raise UsageError(f"work-set {source}: expected a non-empty JSON list of rows")
    items: list[WorkItem] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(data):
        if not isinstance(raw, dict):
            raise UsageError(f"work-set {source}: row {index} is not a JSON object")
        try:
            row = WorkRow.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "row"
            label = f"row {index}" + (f" (id {raw.get('id')!r})" if "id" in raw else "")
            raise UsageError(
                f"work-set {source}: {label}: {where}: {first.get('msg')}; fix the row and rerun"
            ) from None
        item = _item_from_row(index, row)
        if item.test_id in seen:
            raise UsageError(
                f"work-set {source}: duplicate id {item.test_id!r} in rows "
                f"{seen[item.test_id]} and {index}; ids must be unique"
            )
        seen[item.test_id] = index
        items.append(item)
    return Workset(items=tuple(items), sha256=sha256, source=source)


def load_workset(path: str | Path) -> Workset:
    """Read and validate a work-set file. Errors are :class:`UsageError` with one line."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read work-set {p}: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"work-set {p} is not valid JSON: {exc}") from None
    return _named(parse_workset(data, source=str(p), sha256=hashlib.sha256(raw).hexdigest()))


def workset_from_items(items: Sequence[WorkItem], source: str) -> Workset:
    """A work-set built in memory (e.g. by a profile), hashed over its canonical JSON."""
    canonical = json.dumps(
        [items_to_row(i) for i in items], sort_keys=True, separators=(",", ":")
    ).encode()
    return _named(
        Workset(items=tuple(items), sha256=hashlib.sha256(canonical).hexdigest(), source=source)
    )


def shaped_for_cache(workset: Workset, turns: int) -> Workset:
    """``workset`` in the prompt-cache shape (``--cache-shape``): its rows as conversations
    of ``turns`` behind one shared preamble (:func:`core.cache_arm.cache_shaped`)."""
    items = cache_shaped(workset.items, turns)
    return workset_from_items(items, f"{workset.source} (prompt-cache shape, {turns} turns)")


def items_to_row(item: WorkItem) -> dict[str, Any]:
    """The on-disk row for an item (inverse of parsing, for ``make-workset``)."""
    row: dict[str, Any] = {"id": item.test_id}
    if item.prompt is not None:
        row["prompt"] = item.prompt
    if item.messages is not None:
        row["messages"] = [{"role": r, "content": c} for r, c in item.messages]
    for key in ("expected_answer", "family", "fill", "system"):
        value = getattr(item, key)
        if value is not None:
            row[key] = value
    row.update(item.meta)
    return row


def expand_reps(items: Sequence[WorkItem], reps: int) -> tuple[WorkItem, ...]:
    """Each item ``reps`` times as ids ``{id}#r{k}``; ``reps == 1`` keeps ids unchanged.

    Ids depend only on the work-set and ``reps``, never on N, so arms line up.
    """
    if reps < 1:
        raise UsageError(f"--reps must be at least 1 (got {reps})")
    if reps == 1:
        return tuple(items)
    return tuple(item.with_id(rep_id(item.test_id, k)) for item in items for k in range(reps))


#: The work-sets shipped in the package (``data/worksets/<name>.json``).
BUNDLED_WORKSETS: tuple[str, ...] = ("demo", "demo_completions", "mock", "cache_conversations")


def bundled_workset_path(name: str) -> Path:
    """The path of a bundled work-set: ``demo`` (16 open-ended chat prompts, the Action's
    default), ``demo_completions`` (32 completion-style openings a base model continues, run
    by ``demo`` on ``/v1/completions``), ``mock`` (the ``run-mock`` default, a copy of
    ``examples/workset.json``) or ``cache_conversations`` (16 of the completion openings in
    the prompt-cache shape, :func:`~batch_invariance.core.cache_arm.cache_shaped`: four
    conversations of four turns behind one shared preamble, for ``--cache-arm``)."""
    from importlib import resources

    if name not in BUNDLED_WORKSETS:
        raise UsageError(f"no bundled work-set {name!r}; pick one of {', '.join(BUNDLED_WORKSETS)}")
    return Path(str(resources.files("batch_invariance") / "data" / "worksets" / f"{name}.json"))
