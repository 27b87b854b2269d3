"""The spark scorer, family by family: right, wrong and malformed answers, and failure modes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batch_invariance.core.evidence import OK, TRANSPORT_MODES
from batch_invariance.core.plan import WorkItem
from batch_invariance.profiles.spark.scorer import SparkScorer, is_runaway, make_scorer
from batch_invariance.profiles.spark.workset import generate
from batch_invariance.profiles.tokens import approx_token_count
from batch_invariance.run.workset import load_workset
from batch_invariance.scorer_api import Completion, Scorer, evaluate

SCORER = SparkScorer()


def item(family: str, expected: str, **meta: Any) -> WorkItem:
    return WorkItem(
        test_id=f"{family}-t",
        prompt="(prompt)",
        messages=None,
        expected_answer=expected,
        family=family,
        fill=0.1,
        meta=meta,
    )


def judge(
    it: WorkItem, text: str, finish: str | None = "stop", tokens: int | None = 20, n: int = 128
) -> tuple[float | None, bool | None, str | None, str]:
    result = evaluate(
        SCORER,
        it,
        Completion(text=text, finish_reason=finish, completion_tokens=tokens, n_predict=n),
    )
    return result.score, result.passed, result.extracted_answer, result.failure_mode


A2 = item("A2", "KL-5772-LS", relay="Vesper")
A4 = item("A4", "118")
B1 = item("B1", "40")
C1 = item("C1", "79", function="crank_lintel")
D1 = item("D1", "badger; gecko; otter", teams=["teal", "ochre", "violet"])
E1 = item("E1", "180102,541712,916006,964304", keys=["Quartz", "Cobalt", "Tundra", "Zephyr"])
E2_EXPECTED = {
    "carrier": "Nordwind Freight",
    "crates": 3,
    "destination": "Varnholt",
    "fragile": True,
    "weight_kg": 266.0,
}
E2 = item(
    "E2",
    json.dumps(E2_EXPECTED, sort_keys=True, separators=(",", ":")),
    fields=[
        ["carrier", "string"],
        ["destination", "string"],
        ["crates", "integer"],
        ["weight_kg", "number"],
        ["fragile", "boolean"],
    ],
)
TOOLS = [
    {
        "name": "schedule_meeting",
        "parameters": {"attendee": "string", "day": "string", "hour": "integer"},
    },
    {"name": "cancel_meeting", "parameters": {"meeting_id": "integer"}},
]
E3 = item(
    "E3",
    '{"arguments":{"attendee":"Cosima Ruiz","day":"Tuesday","hour":12},"name":"schedule_meeting"}',
    tools=TOOLS,
)
E4_EXPECTED = (
    "def weigh_quorum(n):\n    total = 0\n    for i in range(1, n + 1):\n"
    "        total += i\n    return total\n"
)
E4 = item("E4", E4_EXPECTED, function="weigh_quorum")
E5 = item(
    "E5",
    "fold_lintel",
    target="open_catalog",
    candidates=["fold_lintel", "sift_trellis", "stamp_beacon", "weigh_lintel"],
)

E2_RIGHT = json.dumps(E2_EXPECTED)
E2_WRONG_TYPE = json.dumps({**E2_EXPECTED, "crates": "3"})
E3_ARGS = {"attendee": "Cosima Ruiz", "day": "Tuesday", "hour": 12}
E3_RIGHT = json.dumps({"name": "schedule_meeting", "arguments": E3_ARGS})
E3_WRONG_ARGS = json.dumps({"name": "schedule_meeting", "arguments": {**E3_ARGS, "hour": "12"}})
E3_WRONG_TOOL = '{"name": "cancel_meeting", "arguments": {"meeting_id": 12}}'
E4_RIGHT = f"```python\n{E4_EXPECTED}```"
E4_STILL_BUGGY = E4_RIGHT.replace("n + 1", "n")

# (item, completion text, score, passed, failure mode)
TABLE: list[tuple[WorkItem, str, float, bool, str]] = [
    # A2: exact code
    (A2, "KL-5772-LS", 1.0, True, OK),
    (A2, "The code is kl-5772-ls.", 1.0, True, OK),
    (A2, "KL-5772-LX", 0.0, False, OK),
    (A2, "I am not sure.", 0.0, False, "parse_fail"),
    # A4 / B1 / C1: numeric
    (A4, "118", 1.0, True, OK),
    (A4, "25 * 3 = 75, 75 + 43 = 118. The answer is 118.", 1.0, True, OK),
    (A4, "**118.0**", 1.0, True, OK),
    (A4, "117", 0.0, False, OK),
    # commas only group thousands: "1,18" is not 118
    (A4, "1,18", 0.0, False, OK),
    (item("B1", "1234"), "1,234", 1.0, True, OK),
    (item("B1", "1234"), "The result is 1,234.", 1.0, True, OK),
    (A4, "seventeen", 0.0, False, "parse_fail"),
    (B1, "40", 1.0, True, OK),
    (B1, "x = 41", 0.0, False, OK),
    (B1, "Let me think about the registers. " * 4, 0.0, False, "instruction_fade"),
    (C1, "crank_lintel(16) returns 79", 1.0, True, OK),
    (C1, "80", 0.0, False, OK),
    # a bare number on the first line is the answer, not a number in the explanation after it
    (C1, "79\n\nThe loop adds 0, 4 and 8, so it returns 80 minus n.", 1.0, True, OK),
    (C1, "80\n\nIt returns 79 for 16.", 0.0, False, OK),
    (C1, "", 0.0, False, "empty"),
    # D1: fraction of facts
    (D1, "badger\ngecko\notter", 1.0, True, OK),
    (D1, "- Badger\n- Gecko\n- Otter.", 1.0, True, OK),
    (D1, "badger, gecko and walrus", 2 / 3, False, OK),
    (D1, "badger", 1 / 3, False, "instruction_fade"),
    # E1: ordered codes
    (E1, "180102\n541712\n916006\n964304", 1.0, True, OK),
    (E1, "541712\n180102\n916006\n964304", 0.5, False, OK),
    (E1, "180102\n541712\n916006", 0.75, False, "instruction_fade"),
    (E1, "no codes here", 0.0, False, "parse_fail"),
    # E2: typed fields
    (E2, E2_RIGHT, 1.0, True, OK),
    (E2, f"```json\n{E2_RIGHT}\n```", 1.0, True, OK),
    (E2, E2_WRONG_TYPE, 0.8, False, OK),
    (E2, "carrier: Nordwind Freight", 0.0, False, "no_valid_json"),
    (
        E2,
        "Here is the JSON object you asked for, with every field filled in: " + E2_RIGHT,
        1.0,
        True,
        "instruction_fade",
    ),
    # E3: name + arguments
    (E3, E3_RIGHT, 1.0, True, OK),
    (E3, E3_WRONG_ARGS, 0.5, False, OK),
    (E3, E3_WRONG_TOOL, 0.0, False, OK),
    (E3, "I would call schedule_meeting.", 0.0, False, "no_valid_json"),
    # E4: AST equality
    (E4, E4_RIGHT, 1.0, True, OK),
    (E4, E4_RIGHT.replace("    total += i", "    total = total + i"), 0.0, False, OK),
    (E4, E4_STILL_BUGGY, 0.0, False, OK),
    (E4, "```python\ndef weigh_quorum(n):\n    return (\n```", 0.0, False, "parse_fail"),
    (E4, "Sure, I will fix it.", 0.0, False, "parse_fail"),
    (E4, "\n" + E4_EXPECTED + "\nprint(weigh_quorum(3))\n", 1.0, True, OK),
    (E4, E4_EXPECTED + "\ndef clamp_rating(value, low=0, high=", 1.0, True, OK),
    (
        E4,
        "The bug was the range bound, which stopped one short of n. " * 3 + E4_RIGHT,
        1.0,
        True,
        "instruction_fade",
    ),
    # E5: exact name among candidates
    (E5, "fold_lintel", 1.0, True, OK),
    (E5, "`sift_trellis`", 0.0, False, OK),
    (E5, "open_catalog", 0.0, False, "parse_fail"),
]


@pytest.mark.parametrize(("it", "text", "score", "passed", "mode"), TABLE)
def test_family_table(it: WorkItem, text: str, score: float, passed: bool, mode: str) -> None:
    got_score, got_passed, _, got_mode = judge(it, text)
    assert got_score == pytest.approx(score)
    assert got_passed is passed
    assert got_mode == mode


def test_extracted_answers_are_normalised() -> None:
    assert judge(A4, "The result is 1,180.")[2] == "1180"
    assert judge(E1, "1) 180102\n2) 541712")[2] == "180102,541712"
    assert judge(E2, E2_RIGHT)[2] == E2.expected_answer
    assert judge(E5, "It is fold_lintel, not sift_trellis.")[2] == "fold_lintel"


def test_premature_eos_from_finish_reason_and_token_count() -> None:
    # The budget ran out before any answer: finish reason says so ...
    assert judge(A4, "Let us work through the steps one", finish="length")[3] == "premature_eos"
    # ... or the completion token count reached n_predict when the reason is missing.
    assert judge(A4, "Let us work through", finish=None, tokens=16, n=16)[3] == "premature_eos"
    # A JSON object or code fence that was opened and never closed ended too early.
    assert judge(E2, '{"carrier": "Nordwind', finish="stop")[3] == "premature_eos"
    assert judge(E4, "```python\ndef weigh_quorum(n):\n    total = 0", finish="length")[3] == (
        "premature_eos"
    )
    # An unfenced function that the budget cut off is premature too; the same text that
    # ended on its own is a (wrong) answer.
    cut = "\ndef weigh_quorum(n):\n    total = 0\n    "
    assert judge(E4, cut, finish="length")[3] == "premature_eos"
    assert judge(E4, cut, finish="stop")[3] == "ok"
    assert judge(E4, E4_EXPECTED + "\nThat fixes it.", finish="length")[3] == "ok"
    # An answer that completed within the budget is fine even at the limit.
    assert judge(A4, "118", finish="length", tokens=128)[3] == OK


def test_reasoning_leak_and_runaway_repetition() -> None:
    assert judge(A2, "<think>the relay is Vesper</think>KL-5772-LS")[3] == "reasoning_leak"
    looping = "KL-5772-LS\n" + "the code the code " * 10
    assert judge(A2, looping, finish="length")[3] == "runaway_repetition"
    assert is_runaway("abc " * 12)
    assert is_runaway("180102\n541712\n" + "9" * 40)
    assert not is_runaway("180102\n541712\n916006\n964304")
    assert not is_runaway(E4_RIGHT)


@pytest.mark.parametrize("mode", sorted(TRANSPORT_MODES))
def test_transport_modes_pass_through(mode: str) -> None:
    assert judge(A2, "", finish=mode)[3] == mode


def test_unknown_family_falls_back_to_exact_match() -> None:
    other = item("Z9", "hello")
    assert judge(other, "  hello ")[:2] == (1.0, True)
    assert judge(other, "hello!")[:2] == (0.0, False)


def test_make_scorer_gives_a_scorer() -> None:
    scorer = make_scorer()
    assert isinstance(scorer, Scorer)
    assert scorer.scorer_id == "spark/1"


def test_generated_expected_answers_score_full_marks_after_a_file_round_trip(tmp_path: Any) -> None:
    """Every generated item's own expected answer, as a model would write it, scores 1.0 and
    ``ok`` -- also after make-workset's file format is read back (meta survives as JSON)."""
    from batch_invariance.run.workset import items_to_row

    items = generate(4096, "balanced", 3, approx_token_count)
    path = tmp_path / "ws.json"
    path.write_text(json.dumps([items_to_row(i) for i in items]))
    reloaded = load_workset(path).items
    assert len(reloaded) == len(items)
    for it in reloaded:
        expected = it.expected_answer or ""
        if it.family == "E1":
            answer = expected.replace(",", "\n")
        elif it.family == "D1":
            answer = expected.replace("; ", "\n")
        elif it.family == "E4":
            answer = f"```python\n{expected}```"
        else:
            answer = expected
        score, passed, _, mode = judge(it, answer)
        assert (score, passed, mode) == (1.0, True, OK), it.test_id
        # And a wrong answer of the same shape does not.
        assert judge(it, "0")[1] is False, it.test_id
