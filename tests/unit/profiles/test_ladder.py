"""The length ladder: the default work-set of a cell fills its whole slot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_invariance.cli import main
from batch_invariance.core.evidence import DEFAULT_MAX_BOUND
from batch_invariance.core.plan import duplicate_prompts
from batch_invariance.core.scope import band_edges, required_length
from batch_invariance.errors import UsageError
from batch_invariance.profiles.ladder import LADDER_PROMPTS, build_ladder, ladder_plan
from batch_invariance.profiles.spark.haystack import haystack_blocks
from batch_invariance.profiles.tokens import approx_token_count
from batch_invariance.run.workset import items_to_row


def _rows(ctx: int, n_predict: int, seed: int = 0) -> list[dict[str, object]]:
    return [items_to_row(i) for i in build_ladder(ctx, n_predict, seed, approx_token_count)]


@pytest.mark.parametrize(("ctx", "n_predict"), [(256, 96), (512, 128), (1024, 96), (4096, 128)])
def test_every_band_is_reached_with_enough_distinct_prompts(ctx: int, n_predict: int) -> None:
    items = build_ladder(ctx, n_predict, 0, approx_token_count)
    assert len(items) == LADDER_PROMPTS and LADDER_PROMPTS * DEFAULT_MAX_BOUND >= 3
    assert not duplicate_prompts(items)
    sequences = [int(i.meta["calibrated_tokens"]) + n_predict for i in items]
    # Never past the slot, the top past 3/4 of it, and from 1024 tokens on every band.
    assert max(sequences) < ctx and max(sequences) >= required_length(ctx)
    reached = {next(k for k, (_, hi) in enumerate(band_edges(ctx)) if s <= hi) for s in sequences}
    assert 3 in reached and (ctx < 1024 or reached == {0, 1, 2, 3})
    assert sum(s >= required_length(ctx) for s in sequences) >= 8  # the top band, eight deep


def test_deterministic_for_a_seed_and_real_text() -> None:
    assert _rows(1024, 96) == _rows(1024, 96)
    other = _rows(1024, 96, seed=1)
    assert [r["prompt"] for r in other] != [r["prompt"] for r in _rows(1024, 96)]
    # The documents are the spark corpus's prose, news and code, not filler: the longest
    # prompt opens with the first blocks of its own seeded stream of that corpus.
    top = str(_rows(1024, 96)[-1]["prompt"])
    blocks = haystack_blocks("ladder|0|31")
    for _ in range(3):
        assert " ".join(next(blocks).split()[:12]) in " ".join(top.split())


def test_a_slot_too_small_is_refused_naming_the_smallest_it_can_fill() -> None:
    with pytest.raises(UsageError) as info:
        build_ladder(128, 96, 0, approx_token_count)
    message = str(info.value)
    assert "--ctx 128: too small for the length ladder with --n-predict 96" in message
    smallest = int(message.split("the smallest ctx it can fill is ")[1].split(":")[0])
    assert len(build_ladder(smallest, 96, 0, approx_token_count)) == LADDER_PROMPTS
    with pytest.raises(UsageError):
        build_ladder(smallest - 1, 96, 0, approx_token_count)


def test_the_plan_climbs_through_the_bands() -> None:
    plan = ladder_plan(1024, 96, 60)
    assert list(plan.sequence_targets) == sorted(plan.sequence_targets)
    assert plan.sequence_targets[-1] == int(0.95 * 1024) - 8
    pairs = zip(plan.sequence_targets, plan.prompt_targets, strict=True)
    assert all(s - p == 96 for s, p in pairs)


def test_make_workset_writes_the_ladder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ladder.json"
    argv = ["make-workset", "--ladder", "--ctx", "512", "--n-predict", "64", "--out", str(out)]
    assert main(argv) == 0
    assert json.loads(out.read_text()) == _rows(512, 64)
    assert "wrote 32 items" in capsys.readouterr().out
    assert main([*argv, "--corner", "long"]) == 2
    assert main(["make-workset", "--profile", "spark", "--ctx", "256", "--n-predict", "9",
                 "--out", str(out)]) == 2  # fmt: skip


def test_spark_at_a_small_ctx_no_longer_divides_by_zero(tmp_path: Path) -> None:
    out = tmp_path / "spark.json"
    assert main(["make-workset", "--profile", "spark", "--ctx", "256", "--out", str(out)]) == 0
    assert json.loads(out.read_text())
