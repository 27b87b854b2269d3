"""Spark answer extraction: the answer each family's reply contains, as comparable text.

Pure and deterministic. An extractor reads the visible reply (after any closed thinking
block) and returns the answer in the form its family's judge compares (an upper-case code, a
normalised number, ``;``-joined list items, canonical JSON, a function's source, a helper
name), or ``None`` when the reply holds none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batch_invariance.core.plan import WorkItem
from batch_invariance.profiles.spark.task import canonical_json

_A2_CODE = re.compile(r"\b([A-Z]{2}-\d{4}-[A-Z]{2})\b", re.IGNORECASE)
_E1_CODE = re.compile(r"(?<!\d)(\d{6})(?!\d)")
# Commas only as thousands separators: "1,234" is 1234, "1,18" is two numbers.
_NUMBER_TEXT = r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_NUMBER = re.compile(_NUMBER_TEXT)
_ANSWER_NUMBER = re.compile(
    rf"(?:answer|result|returns?|is|=)\s*[:*]*\s*\**\s*({_NUMBER_TEXT})", re.IGNORECASE
)
_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_BULLET = re.compile(r"^[\s\-*•>#]*(?:\d+[.)]\s*)?")


def visible_text(text: str) -> str:
    """The part of a completion after any closed thinking block."""
    for marker in ("</think>", "</reasoning>"):
        if marker in text:
            text = text.rsplit(marker, 1)[1]
    return text.strip()


@dataclass(frozen=True)
class JsonSpan:
    """A JSON object found in a reply, with the offsets of its text."""

    value: dict[str, Any]
    start: int
    end: int


@dataclass(frozen=True)
class CodeBlock:
    """A function's source found in a reply, and how much else the reply says."""

    code: str
    #: Non-space characters of the reply outside the block (fences not counted).
    outside_chars: int


def first_json_object(text: str) -> JsonSpan | None:
    """The first JSON object in ``text`` with its start and end offsets, or ``None``."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, end = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict):
            return JsonSpan(value, match.start(), end)
    return None


def _normal_number(raw: str) -> str | None:
    cleaned = raw.replace(",", "")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    if value.is_integer():
        return str(int(value))
    return repr(value)


def non_space(text: str) -> int:
    return len(re.sub(r"\s+", "", text))


def _list_items(text: str) -> list[str]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) <= 1:
        lines = re.split(r",|;|\band\b", text)
    items: list[str] = []
    for line in lines:
        item = _BULLET.sub("", line).strip().strip(".,;:!*`\"'").strip().lower()
        if item:
            items.append(item)
    return items


def extract_a2(text: str, item: WorkItem) -> str | None:
    match = _A2_CODE.search(text)
    return match.group(1).upper() if match else None


def _bare_number(line: str) -> str | None:
    bare = line.strip().strip("*`.").strip()
    return _normal_number(bare) if _NUMBER.fullmatch(bare) else None


def extract_number(text: str, item: WorkItem) -> str | None:
    # The reply, or its first line, is just a number: that is the answer, whatever a
    # following explanation mentions.
    for candidate in (text, text.strip().split("\n", 1)[0]):
        bare = _bare_number(candidate)
        if bare is not None:
            return bare
    stated = _ANSWER_NUMBER.findall(text)
    if stated:
        return _normal_number(stated[-1])
    numbers = _NUMBER.findall(text)
    return _normal_number(numbers[-1]) if numbers else None


def extract_d1(text: str, item: WorkItem) -> str | None:
    items = _list_items(text)
    return "; ".join(items) if items else None


def extract_e1(text: str, item: WorkItem) -> str | None:
    codes = _E1_CODE.findall(text)
    return ",".join(codes) if codes else None


def extract_json(text: str, item: WorkItem) -> str | None:
    found = first_json_object(text)
    return canonical_json(found.value) if found else None


def code_block(text: str) -> CodeBlock | None:
    """The first fenced block that defines a function (or the first ``def`` onwards) and how
    many non-space characters of the text lie outside it."""
    for match in _FENCE.finditer(text):
        if "def " in match.group(1):
            outside = text[: match.start()] + text[match.end() :]
            return CodeBlock(match.group(1).strip("\n"), non_space(outside.replace("```", "")))
    start = text.find("def ")
    if start < 0:
        return None
    # Unfenced: the function runs until the first non-indented line after its header.
    lines = text[start:].replace("```", "").split("\n")
    end = next(
        (i for i, ln in enumerate(lines[1:], 1) if ln.strip() and not ln[:1].isspace()),
        len(lines),
    )
    code = "\n".join(lines[:end]).strip("\n")
    rest = "\n".join(lines[end:])
    return CodeBlock(code, non_space(text[:start]) + non_space(rest))


def extract_e4(text: str, item: WorkItem) -> str | None:
    block = code_block(text)
    return block.code.rstrip() if block else None


def extract_e5(text: str, item: WorkItem) -> str | None:
    candidates: Sequence[str] = item.meta.get("candidates", [])
    best: tuple[int, str] | None = None
    for name in candidates:
        match = re.search(rf"\b{re.escape(name)}\b", text)
        if match and (best is None or match.start() < best[0]):
            best = (match.start(), name)
    return best[1] if best else None
