"""Work-set validation: errors name the row, duplicate ids are refused, examples load."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from batch_invariance.errors import UsageError
from batch_invariance.run.workset import (
    expand_reps,
    items_to_row,
    load_workset,
    parse_workset,
    workset_from_items,
)
from tests.support.paths import EXAMPLES

EXAMPLE = EXAMPLES / "workset.json"


def _error(data: Any) -> str:
    with pytest.raises(UsageError) as info:
        parse_workset(data, source="ws.json")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_example_workset_uses_prompts_and_messages() -> None:
    ws = load_workset(EXAMPLE)
    assert len(ws.items) >= 12 and len(ws.sha256) == 64
    assert any(i.prompt is not None for i in ws.items)
    assert any(i.messages is not None for i in ws.items)
    assert any(i.system is not None for i in ws.items)
    assert all(i.expected_answer and i.family for i in ws.items)
    assert len({i.family for i in ws.items}) >= 3


def test_bundled_mock_workset_is_the_example() -> None:
    bundled = resources.files("batch_invariance").joinpath("data/worksets/mock.json")
    assert json.loads(bundled.read_text()) == json.loads(EXAMPLE.read_text())


def test_rows_without_ids_get_positional_ids_and_extra_keys_are_kept() -> None:
    ws = parse_workset([{"prompt": "a"}, {"prompt": "b", "difficulty": 3}])
    assert [i.test_id for i in ws.items] == ["row0000", "row0001"]
    assert ws.items[1].meta == {"difficulty": 3}
    assert items_to_row(ws.items[1])["difficulty"] == 3


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        ([{"prompt": "a"}, {"id": "x"}], "row 1 (id 'x')"),
        ([{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}], "row 0"),
        ([{"id": "m", "messages": []}], "row 0 (id 'm')"),
        ([{"prompt": "a"}, {"prompt": "b"}, {"messages": [{"role": "bot", "content": "x"}]}],
         "row 2"),
        ([{"prompt": "a", "fill": "lots"}], "fill"),
        ([{"prompt": "a", "id": "  "}], "row 0"),
        ([{"prompt": "a"}, 7], "row 1 is not a JSON object"),
    ],
)  # fmt: skip
def test_validation_errors_name_the_row(rows: list[Any], needle: str) -> None:
    message = _error(rows)
    assert needle in message and "ws.json" in message


def test_duplicate_ids_are_refused() -> None:
    message = _error([{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"},
                      {"id": "a", "prompt": "z"}])  # fmt: skip
    assert "duplicate id 'a'" in message and "rows 0 and 2" in message


@pytest.mark.parametrize("data", [[], {}, "rows", None])
def test_not_a_list_of_rows(data: Any) -> None:
    assert "non-empty JSON list" in _error(data)


def test_file_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read work-set"):
        load_workset(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_workset(bad)


def test_expand_reps_ids_are_stable_and_independent_of_n() -> None:
    ws = parse_workset([{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}])
    assert expand_reps(ws.items, 1) == ws.items
    assert [i.test_id for i in expand_reps(ws.items, 2)] == ["a#r0", "a#r1", "b#r0", "b#r1"]
    with pytest.raises(UsageError):
        expand_reps(ws.items, 0)


def test_in_memory_worksets_hash_their_canonical_rows() -> None:
    items = parse_workset([{"id": "a", "prompt": "x"}]).items
    assert workset_from_items(items, "gen").sha256 == workset_from_items(items, "gen").sha256
    other = parse_workset([{"id": "a", "prompt": "y"}]).items
    assert workset_from_items(items, "gen").sha256 != workset_from_items(other, "gen").sha256


def test_chat32_example_is_the_chat_demo_plus_sixteen_distinct_prompts() -> None:
    """docs/numerics.md's live chat cells ran on it: 32 distinct prompts clear the per-prompt
    bound (<= 0.1), so only the numerics can keep such a cell from GREEN."""
    ws = load_workset(EXAMPLE.with_name("workset_chat32.json"))
    prompts = [i.prompt for i in ws.items]
    assert len(ws.items) == 32 and len(set(prompts)) == 32 and None not in prompts
    demo = resources.files("batch_invariance").joinpath("data/worksets/demo.json")
    assert json.loads(demo.read_text()) == [
        {"id": i.test_id, "family": i.family, "prompt": i.prompt} for i in ws.items[:16]
    ]
