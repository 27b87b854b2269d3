"""The spark scorer: per-family scoring and failure modes (answer extraction: ``extract.py``).

Profile entry point: :func:`make_scorer`. Everything here is pure and deterministic; the
family comes from ``item.family`` and what a family needs beyond the expected answer (key
order, typed fields, tool list, function name, candidate helpers) from ``item.meta``, so a
work-set written by ``make-workset`` and read back scores the same.

Failure modes, in the order they are decided:

``<transport mode>``
    passed through when the completion carries one as its finish reason.
``empty``
    nothing but whitespace.
``reasoning_leak``
    thinking-channel markup (``<think>``, ``<|channel|>``, ...) in the visible answer.
``runaway_repetition``
    the completion ends in one unit repeated at least four times (at least 32 characters).
``premature_eos``
    the completion ended (end-of-sequence or the token budget, from ``finish_reason`` and
    ``completion_tokens``) before the answer was complete: a JSON object or code fence left
    open, or no answer at all when the budget ran out.
``no_valid_json``
    E2/E3 without any parsable JSON object.
``parse_fail``
    an attempt at the answer that cannot be read (no value in a short reply, E4 code that does
    not parse).
``instruction_fade``
    the requested form was ignored: no answer in a long reply, prose around a JSON object or
    code block that was asked for alone, or the wrong number of items (E1, D1).
``ok``
    genuinely scored.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batch_invariance.core.evidence import OK, TRANSPORT_MODES
from batch_invariance.core.plan import WorkItem
from batch_invariance.core.scoring import Completion, Score, Scorer
from batch_invariance.profiles.spark.extract import (
    code_block,
    extract_a2,
    extract_d1,
    extract_e1,
    extract_e4,
    extract_e5,
    extract_json,
    extract_number,
    first_json_object,
    non_space,
    visible_text,
)

EMPTY = "empty"
PREMATURE_EOS = "premature_eos"
REASONING_LEAK = "reasoning_leak"
RUNAWAY_REPETITION = "runaway_repetition"
NO_VALID_JSON = "no_valid_json"
PARSE_FAIL = "parse_fail"
INSTRUCTION_FADE = "instruction_fade"

_REASONING_MARKERS = ("<think>", "</think>", "<|channel|>", "<reasoning>", "</reasoning>")

#: Longest reply (characters) still read as an attempt when no answer is found in it.
_ATTEMPT_CHARS = 80
#: Prose allowed around an answer that was asked for alone (non-space characters).
_JSON_SLACK = 40
_CODE_SLACK = 80


def is_runaway(text: str, min_span: int = 32, min_reps: int = 4) -> bool:
    """True when the text ends in one unit repeated ``min_reps`` times over ``min_span`` chars.

    A trailing partial unit (a cut at the token budget) still counts.
    """
    tail = text.rstrip()[-2000:]
    n = len(tail)
    for period in range(1, min(200, n // min_reps) + 1):
        run = 0
        i = n - period - 1
        while i >= 0 and tail[i] == tail[i + period]:
            run += 1
            i -= 1
        span = run + period
        if span >= max(min_span, min_reps * period):
            return True
    return False


# ----------------------------------------------------------------- scoring
def _hit(ok: bool) -> Score:
    return Score(value=1.0 if ok else 0.0, passed=ok)


def _score_exact(extracted: str, expected: str, item: WorkItem) -> Score:
    return _hit(extracted.strip() == expected.strip())


def _score_numeric(extracted: str, expected: str, item: WorkItem) -> Score:
    try:
        return _hit(float(extracted) == float(expected))
    except ValueError:
        return _hit(False)


def _score_d1(extracted: str, expected: str, item: WorkItem) -> Score:
    facts = [f.strip().lower() for f in expected.split(";") if f.strip()]
    answers = [a.strip() for a in extracted.split(";")]
    found = sum(any(re.search(rf"\b{re.escape(f)}\b", a) for a in answers) for f in facts)
    value = found / len(facts) if facts else 0.0
    return Score(value=value, passed=bool(facts) and found == len(facts))


def _score_e1(extracted: str, expected: str, item: WorkItem) -> Score:
    got = extracted.split(",")
    want = expected.split(",")
    right = sum(1 for g, w in zip(got, want, strict=False) if g == w)
    return Score(value=right / len(want), passed=got == want)


def typed_equal(actual: Any, expected: Any, kind: str) -> bool:
    """Value equality that also requires the JSON type named by ``kind``."""
    if kind == "boolean":
        return isinstance(actual, bool) and actual == expected
    if kind == "integer":
        return isinstance(actual, int) and not isinstance(actual, bool) and actual == expected
    if kind == "number":
        return (
            isinstance(actual, (int, float))
            and not isinstance(actual, bool)
            and float(actual) == float(expected)
        )
    if kind == "string":
        return isinstance(actual, str) and actual.strip() == str(expected).strip()
    return bool(actual == expected)


def _score_e2(extracted: str, expected: str, item: WorkItem) -> Score:
    got = json.loads(extracted)
    want = json.loads(expected)
    fields: Sequence[Sequence[str]] = item.meta.get("fields") or [
        [k, _json_kind(v)] for k, v in want.items()
    ]
    right = sum(
        1 for name, kind in fields if name in got and typed_equal(got[name], want[name], kind)
    )
    exact_keys = set(got) == {name for name, _ in fields}
    return Score(value=right / len(fields), passed=right == len(fields) and exact_keys)


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


def _score_e3(extracted: str, expected: str, item: WorkItem) -> Score:
    got = json.loads(extracted)
    want = json.loads(expected)
    name_ok = got.get("name") == want["name"]
    schema: Mapping[str, str] = next(
        (t["parameters"] for t in item.meta.get("tools", []) if t.get("name") == want["name"]),
        {k: _json_kind(v) for k, v in want["arguments"].items()},
    )
    args = got.get("arguments")
    args_ok = (
        isinstance(args, dict)
        and set(args) == set(schema)
        and all(typed_equal(args[k], want["arguments"][k], schema[k]) for k in schema)
    )
    value = 1.0 if name_ok and args_ok else 0.5 if name_ok else 0.0
    return Score(value=value, passed=value == 1.0)


def _function_dump(source: str, name: str | None) -> str | None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and (name is None or node.name == name):
            return ast.dump(node)
    return None


def _score_e4(extracted: str, expected: str, item: WorkItem) -> Score:
    name = item.meta.get("function")
    got = _function_dump(extracted, name)
    want = _function_dump(expected, name)
    return _hit(got is not None and got == want)


@dataclass(frozen=True)
class _FamilyRule:
    """How one family's answer is read from the reply and judged against the expected one."""

    extract: Callable[[str, WorkItem], str | None]
    judge: Callable[[str, str, WorkItem], Score]


_FAMILIES: Mapping[str, _FamilyRule] = {
    "A2": _FamilyRule(extract_a2, _score_exact),
    "A4": _FamilyRule(extract_number, _score_numeric),
    "B1": _FamilyRule(extract_number, _score_numeric),
    "C1": _FamilyRule(extract_number, _score_numeric),
    "D1": _FamilyRule(extract_d1, _score_d1),
    "E1": _FamilyRule(extract_e1, _score_e1),
    "E2": _FamilyRule(extract_json, _score_e2),
    "E3": _FamilyRule(extract_json, _score_e3),
    "E4": _FamilyRule(extract_e4, _score_e4),
    "E5": _FamilyRule(extract_e5, _score_exact),
}

_JSON_FAMILIES = frozenset({"E2", "E3"})


def _truncated(completion: Completion) -> bool:
    if completion.finish_reason == "length":
        return True
    return (
        completion.completion_tokens is not None
        and completion.n_predict is not None
        and completion.completion_tokens >= completion.n_predict
    )


def _left_open(family: str | None, text: str) -> bool:
    """An answer that started but never closed: an unbalanced JSON object or code fence."""
    if family in _JSON_FAMILIES:
        return "{" in text and first_json_object(text) is None
    if family == "E4":
        return text.count("```") % 2 == 1
    return False


def _code_runs_to_the_end(visible: str, extracted: str | None) -> bool:
    """An unfenced function that is the last thing in the reply (cut there by the budget)."""
    return (
        extracted is not None
        and "```" not in visible
        and visible.rstrip().endswith(extracted.rstrip())
    )


class SparkScorer(Scorer):
    """Scores the ten spark families; unknown families fall back to exact match."""

    scorer_id = "spark/1"

    def extract_answer(self, text: str, item: WorkItem) -> str | None:
        visible = visible_text(text)
        if not visible:
            return None
        entry = _FAMILIES.get(item.family or "")
        if entry is None:
            return visible
        return entry.extract(visible, item)

    def classify_failure_mode(
        self, completion: Completion, item: WorkItem, extracted: str | None
    ) -> str:
        if completion.finish_reason in TRANSPORT_MODES:
            return str(completion.finish_reason)
        text = completion.text
        if not text.strip():
            return EMPTY
        if any(marker in text for marker in _REASONING_MARKERS):
            return REASONING_LEAK
        if is_runaway(text):
            return RUNAWAY_REPETITION
        visible = visible_text(text)
        family = item.family
        if _left_open(family, visible) or (extracted is None and _truncated(completion)):
            return PREMATURE_EOS
        if family == "E4" and _truncated(completion) and _code_runs_to_the_end(visible, extracted):
            return PREMATURE_EOS
        if family not in _FAMILIES:
            return OK
        if extracted is None:
            if family in _JSON_FAMILIES:
                return NO_VALID_JSON
            if family == "E4" or len(visible) <= _ATTEMPT_CHARS:
                return PARSE_FAIL
            return INSTRUCTION_FADE
        return self._form_check(family, visible, extracted, item)

    @staticmethod
    def _form_check(family: str | None, visible: str, extracted: str, item: WorkItem) -> str:
        if family == "E4":
            if _function_dump(extracted, None) is None:
                return PARSE_FAIL
            block = code_block(visible)
            if block is not None and block.outside_chars > _CODE_SLACK:
                return INSTRUCTION_FADE
        elif family in _JSON_FAMILIES:
            found = first_json_object(visible)
            if found is not None:
                outside = visible[: found.start] + visible[found.end :]
                outside = re.sub(r"```(?:json)?", "", outside)
                if non_space(outside) > _JSON_SLACK:
                    return INSTRUCTION_FADE
        elif family == "E1":
            if len(extracted.split(",")) != len(item.meta.get("keys", [])):
                return INSTRUCTION_FADE
        elif family == "D1" and len(extracted.split(";")) < len(item.meta.get("teams", [])):
            return INSTRUCTION_FADE
        return OK

    def score(self, extracted: str | None, expected: str | None, item: WorkItem) -> Score:
        if expected is None:
            return Score(value=None, passed=None)
        if extracted is None:
            return Score(value=0.0, passed=False)
        entry = _FAMILIES.get(item.family or "")
        if entry is None:
            return _score_exact(extracted, expected, item)
        return entry.judge(extracted, expected, item)


def make_scorer() -> Scorer:
    """Profile entry point: the spark scorer."""
    return SparkScorer()
