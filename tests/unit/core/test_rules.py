"""RULES_VERSION moves whenever the decision rules do (core/rules.py).

The corpus of tests/support/rules_corpus.py is judged by this code and set against
tests/golden/rules/verdicts.json, which records the judgement and the rules it was made
under. A changed judgement under the recorded RULES_VERSION fails; regenerating
(BATCH_INVARIANCE_REGEN_GOLDEN=1) is refused until RULES_VERSION is bumped. The checker's own
tests below show that it fails on a tampered table, a hand edit and a version that went back.
A change of the corpus itself (a case added or rebuilt, not a rule): delete the file and
regenerate it under the same RULES_VERSION, and review its diff like code.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest

from batch_invariance.core.rules import RULES_VERSION, rules_words
from tests.support.golden import REGEN_ENV
from tests.support.rules_corpus import (
    load_record,
    may_regenerate,
    rules_problem,
    table_digest,
    verdict_table,
    write_record,
)

BUMP = (
    "decision rules changed: bump RULES_VERSION in core/rules.py and regenerate with "
    "BATCH_INVARIANCE_REGEN_GOLDEN=1"
)


@pytest.fixture(scope="module")
def table() -> dict[str, dict[str, Any]]:
    return verdict_table()


def test_the_corpus_is_judged_as_recorded_under_these_rules(
    table: dict[str, dict[str, Any]],
) -> None:
    recorded = load_record()
    if os.environ.get(REGEN_ENV) and may_regenerate(recorded, table, RULES_VERSION):
        write_record(table, RULES_VERSION)
        recorded = load_record()
    problem = rules_problem(recorded, table, RULES_VERSION)
    if problem is not None:
        pytest.fail(problem, pytrace=False)


def test_the_corpus_reaches_every_kind_of_judgement(table: dict[str, dict[str, Any]]) -> None:
    """A corpus that judged everything alike would pin nothing."""
    statuses = {row.get("status") for row in table.values()}
    assert statuses >= {"green", "failed", "green_with_caveat", "green_unverified"}
    assert {row.get("promotable") for row in table.values()} == {True, False}
    assert any(row["structure"] for row in table.values())
    assert any(row["identity"] for row in table.values())
    assert sum(name.startswith("example:") for name in table) >= 3
    for name, row in table.items():
        kind = name.split("_")[0]
        expected = {
            "red": "failed", "amber": "green_with_caveat", "unverified": "green_unverified",
        }.get(kind)  # fmt: skip
        assert expected is None or row["status"] == expected, (name, row["decision_reasons"])


def _recorded(table: dict[str, dict[str, Any]], rules: int) -> dict[str, Any]:
    return {"rules_version": rules, "digest": table_digest(table), "table": table}


def test_a_changed_judgement_under_the_same_rules_fails_and_may_not_be_regenerated(
    table: dict[str, dict[str, Any]],
) -> None:
    tampered = copy.deepcopy(table)
    tampered["green"]["status"] = "green_with_caveat"
    recorded = _recorded(tampered, RULES_VERSION)  # what the file would hold
    problem = rules_problem(recorded, table, RULES_VERSION)
    assert problem == f"{BUMP} (changed: green)"
    assert not may_regenerate(recorded, table, RULES_VERSION)
    # a changed reason or a changed derived field is a changed judgement too
    for field, value in (("decision_reasons", ["other words"]), ("derived_sha256", "x")):
        tampered = copy.deepcopy(table)
        tampered["red_co_batching"][field] = value
        assert rules_problem(_recorded(tampered, RULES_VERSION), table, RULES_VERSION) == (
            f"{BUMP} (changed: red_co_batching)"
        )


def test_a_bump_allows_regeneration_and_then_passes(table: dict[str, dict[str, Any]]) -> None:
    tampered = copy.deepcopy(table)
    tampered["green"]["promotable"] = False
    old = _recorded(tampered, RULES_VERSION)
    bumped = RULES_VERSION + 1
    problem = rules_problem(old, table, bumped)
    assert problem is not None and problem.startswith(
        f"RULES_VERSION is {bumped}, tests/golden/rules/verdicts.json records rules "
        f"{RULES_VERSION}: regenerate with BATCH_INVARIANCE_REGEN_GOLDEN=1"
    )
    assert may_regenerate(old, table, bumped)
    assert rules_problem(_recorded(table, bumped), table, bumped) is None


def test_a_hand_edit_and_a_version_going_back_fail(table: dict[str, dict[str, Any]]) -> None:
    edited = _recorded(table, RULES_VERSION)
    edited["table"] = {**table, "green": {**table["green"], "verdict": "RED"}}
    assert "edited by hand" in str(rules_problem(edited, table, RULES_VERSION))
    later = _recorded(table, RULES_VERSION + 1)
    assert "it only ever goes up" in str(rules_problem(later, table, RULES_VERSION))
    assert not may_regenerate(later, table, RULES_VERSION)
    assert "is missing" in str(rules_problem(None, table, RULES_VERSION))


def test_rules_in_words() -> None:
    assert rules_words(3, "0.2.0") == "rules 3"
    assert rules_words(None, "0.1.0") == "unversioned rules of 0.1.0"
