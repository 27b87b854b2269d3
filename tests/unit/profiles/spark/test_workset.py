"""The spark work-set generator: determinism, fills, needles, corpus."""

from __future__ import annotations

import ast
import json
import os
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from batch_invariance.core.plan import WorkItem
from batch_invariance.errors import UsageError
from batch_invariance.profiles.spark.calibrate import DOC_END, NoFit, PromptParts, fit_prompt
from batch_invariance.profiles.spark.families import FAMILIES
from batch_invariance.profiles.spark.haystack import haystack_blocks, load_corpus
from batch_invariance.profiles.spark.task import canonical_json
from batch_invariance.profiles.spark.workset import CORNERS, generate
from batch_invariance.profiles.tokens import approx_token_count
from batch_invariance.run.workset import items_to_row


def render(items: list[WorkItem]) -> bytes:
    return json.dumps([items_to_row(i) for i in items], sort_keys=True).encode()


def chars_counter(text: str) -> int:
    """A second, very different tokenizer stand-in (about 3.5 characters a token)."""
    return (len(text) * 2 + 6) // 7


def test_same_seed_gives_byte_identical_worksets() -> None:
    a = generate(4096, "balanced", 7, approx_token_count)
    b = generate(4096, "balanced", 7, approx_token_count)
    assert render(a) == render(b)


def test_different_seeds_give_different_tasks() -> None:
    a = generate(4096, "balanced", 1, approx_token_count)
    b = generate(4096, "balanced", 2, approx_token_count)
    assert [i.expected_answer for i in a] != [i.expected_answer for i in b]


def test_tasks_do_not_depend_on_the_tokenizer() -> None:
    """Needles, questions and answers come from the seed; only the haystack length changes."""
    a = generate(8192, "balanced", 0, approx_token_count)
    b = generate(8192, "balanced", 0, chars_counter)
    assert [(i.test_id, i.expected_answer) for i in a] == [
        (i.test_id, i.expected_answer) for i in b
    ]
    assert [i.prompt for i in a] != [i.prompt for i in b]
    for x, y in zip(a, b, strict=True):
        assert x.prompt is not None and y.prompt is not None
        assert x.prompt.rsplit(DOC_END, 1)[1] == y.prompt.rsplit(DOC_END, 1)[1]


@pytest.mark.parametrize("corner", sorted(CORNERS))
@pytest.mark.parametrize("counter", [approx_token_count, chars_counter])
def test_every_prompt_lands_within_three_percent(
    corner: str, counter: Callable[[str], int]
) -> None:
    ctx = 8192
    items = generate(ctx, corner, 0, counter)
    assert len(items) == len(FAMILIES) * len(CORNERS[corner])
    for it in items:
        assert it.prompt is not None and it.fill is not None
        target = round(it.fill * ctx)
        measured = counter(it.prompt)
        assert abs(measured - target) <= 0.03 * target, (it.test_id, measured, target)
        assert it.meta["target_tokens"] == target
        assert it.meta["calibrated_tokens"] == measured


def test_corner_fills_and_ids() -> None:
    assert CORNERS == {
        "balanced": (0.10, 0.35, 0.60, 0.85),
        "short": (0.05, 0.15),
        "long": (0.75, 0.90, 0.97),
    }
    items = generate(16384, "long", 0, approx_token_count)
    ids = [i.test_id for i in items]
    assert len(ids) == len(set(ids)) == 30
    assert {i.family for i in items} == set(FAMILIES)
    assert {i.fill for i in items} == {0.75, 0.90, 0.97}
    assert "A2-fill97" in ids and "E5-fill75" in ids


def test_each_fill_of_a_family_gets_its_own_needle_and_answer() -> None:
    items = generate(8192, "balanced", 0, approx_token_count)
    by_family: dict[str, list[WorkItem]] = {}
    for it in items:
        by_family.setdefault(it.family or "", []).append(it)
    for family, group in by_family.items():
        answers = [i.expected_answer for i in group]
        assert len(set(answers)) == len(answers), family


def test_needle_answers_occur_exactly_once() -> None:
    """The haystack never contains a needle's answer, so there is one right place to find it."""
    for seed in range(3):
        for it in generate(4096, "balanced", seed, approx_token_count):
            prompt = it.prompt or ""
            expected = it.expected_answer or ""
            if it.family == "A2":
                assert prompt.count(expected) == 1
            elif it.family == "E1":
                for code in expected.split(","):
                    assert len(re.findall(rf"(?<!\d){code}(?!\d)", prompt)) == 1
            elif it.family == "D1":
                for animal in expected.split("; "):
                    assert len(re.findall(rf"\b{animal}\b", prompt)) == 1, (it.test_id, animal)
            elif it.family == "E5":
                assert len(re.findall(rf"\bdef {expected}\(", prompt)) == 1


def test_tiny_ctx_leaves_out_what_does_not_fit_and_says_so() -> None:
    skipped: list[str] = []
    items = generate(2048, "short", 0, approx_token_count, skipped=skipped)
    assert items and skipped
    assert all(i.fill == 0.15 or i.family == "C1" for i in items)
    assert any("alone take" in note for note in skipped)
    with pytest.raises(UsageError, match="too small"):
        generate(100, "short", 0, approx_token_count)


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="corner"):
        generate(4096, "huge", 0, approx_token_count)
    with pytest.raises(UsageError, match="ctx"):
        generate(0, "short", 0, approx_token_count)
    with pytest.raises(UsageError, match="unknown families"):
        generate(4096, "short", 0, approx_token_count, families=["Q1"])


def test_family_subset() -> None:
    items = generate(4096, "short", 0, approx_token_count, families=["A2", "E4"])
    assert {i.family for i in items} == {"A2", "E4"}


def test_c1_expected_value_is_what_the_function_returns() -> None:
    for k in range(40):
        task = FAMILIES["C1"](random.Random(k))
        source = task.needles[0].split("\n\n", 1)[1]
        namespace: dict[str, object] = {}
        exec(source, namespace)
        fn = namespace[task.meta["function"]]
        assert callable(fn)
        assert str(fn(task.meta["argument"])) == task.expected


def test_e4_bug_is_one_real_change() -> None:
    for k in range(30):
        task = FAMILIES["E4"](random.Random(k))
        buggy = task.needles[0].split("\n\n", 1)[1]
        assert ast.dump(ast.parse(buggy)) != ast.dump(ast.parse(task.expected))
        diff = [
            (a, b)
            for a, b in zip(buggy.splitlines(), task.expected.splitlines(), strict=True)
            if a != b
        ]
        assert len(diff) == 1


def test_e5_has_exactly_one_right_helper() -> None:
    for k in range(30):
        task = FAMILIES["E5"](random.Random(k))
        tree = ast.parse(task.needles[0].split("\n\n", 1)[1])
        target = task.meta["target"]
        matches = []
        for fn in tree.body:
            assert isinstance(fn, ast.FunctionDef)
            calls = {
                n.func.id
                for n in ast.walk(fn)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            }
            returns_dict = any(
                isinstance(n, ast.Return) and isinstance(n.value, ast.Dict) for n in ast.walk(fn)
            )
            if target in calls and returns_dict:
                matches.append(fn.name)
        assert matches == [task.expected]


def test_json_families_expected_answers_are_canonical() -> None:
    for family in ("E2", "E3"):
        task = FAMILIES[family](random.Random(5))
        assert canonical_json(json.loads(task.expected)) == task.expected


def test_haystack_is_varied_prose_news_and_code() -> None:
    corpus = load_corpus()
    assert len(corpus.prose) >= 12 and len(corpus.news) >= 10 and len(corpus.code) >= 8
    stream = haystack_blocks("variety")
    blocks = [next(stream) for _ in range(60)]
    assert len(set(blocks)) >= 0.9 * len(blocks)
    assert any(b.startswith(("def ", "class ")) for b in blocks)
    assert any("—" in b for b in blocks)  # news datelines
    # No unfilled slots anywhere.
    assert not any(re.search(r"\{[a-z]+\d?\}", b) for b in blocks)
    # Prefix-stable: the first blocks do not depend on how many are drawn.
    again = haystack_blocks("variety")
    assert [next(again) for _ in range(10)] == blocks[:10]


def test_generation_is_hermetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is read from the current folder: an empty one changes nothing."""
    before = render(generate(4096, "short", 0, approx_token_count))
    monkeypatch.chdir(tmp_path)
    assert os.listdir(tmp_path) == []
    assert render(generate(4096, "short", 0, approx_token_count)) == before


def test_fit_prompt_reports_when_the_fixed_parts_are_too_long() -> None:
    parts = PromptParts(intro="intro " * 50, needles=("n",), depths=(0.5,), question="q?")
    result = fit_prompt(parts, haystack_blocks("x"), 20, approx_token_count)
    assert isinstance(result, NoFit)
    assert result.min_tokens > 20
