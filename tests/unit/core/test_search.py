"""The search's rules: the probe's prompts, a probe that can only reject, the fastest
promotable GREEN, the positive control, and the table (golden)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from batch_invariance.core.search import (
    Interleaved,
    Measured,
    Round,
    SearchRow,
    answer,
    probe_ids,
    probe_rejects,
    round_order,
    row_verdict,
    vs_default,
)
from batch_invariance.report.search_text import search_text
from batch_invariance.service.search_record import search_record
from tests.support.golden import check_golden


def seen(verdict: str, **kw: object) -> Measured:
    values: dict[str, object] = dict(
        path="/certs/x.json", valid=True, verdict=verdict, promotable=False, slot_ctx=1024,
        longest=980, first_drift_position=None, bitwise_equal_up_to=None, speedup=None,
        concurrent_tokens_per_s=None,
    )  # fmt: skip
    values.update(kw)
    return Measured(**values)  # type: ignore[arg-type]


def test_the_probe_takes_the_shortest_prompts_past_each_boundary_and_the_longest() -> None:
    seqs = [("a", 100), ("b", 250), ("c", 300), ("d", 270), ("e", 600), ("f", 990), ("g", 900)]
    assert probe_ids(seqs, (256,)) == ("c", "d", "f", "g")
    # No boundary known: only the slot's end.
    assert probe_ids(seqs, ()) == ("f", "g")


def test_a_probe_only_rejects_and_never_gives_green() -> None:
    assert probe_rejects(seen("RED")) and probe_rejects(seen("AMBER"))
    assert not probe_rejects(seen("GREEN")) and not probe_rejects(seen("UNVERIFIED"))
    assert not probe_rejects(seen("RED", valid=False))
    # Even a probe cert that says GREEN and promotable is not a GREEN row without its cert.
    green_probe = SearchRow("ub1", "-ub 1", False, probe=seen("GREEN", promotable=True))
    assert row_verdict(green_probe) == "not certified (probe saw no drift)"
    assert answer([green_probe]).fastest_green is None
    red_probe = SearchRow("fa-on", "-fa on", False, probe=seen("RED", first_drift_position=257))
    assert row_verdict(red_probe) == "RED (probe)"
    # Too small a sample for AMBER, but drift seen: rejected all the same (live, fa-off at
    # ctx 512 N 2 came out so, and its full cert was RED from position 84).
    drift = SearchRow("fa-off", "-fa off", False,
                      probe=seen("UNVERIFIED", first_drift_position=243))  # fmt: skip
    assert probe_rejects(drift.probe) and row_verdict(drift) == "drift (probe)"


def test_the_fastest_promotable_green_wins_and_the_control_must_be_red() -> None:
    defaults = SearchRow("defaults", "(defaults)", True,
                         cert=seen("RED", concurrent_tokens_per_s=80.0, speedup=1.7))  # fmt: skip
    slow = SearchRow("ub1", "-ub 1", False,
                     cert=seen("GREEN", promotable=True, concurrent_tokens_per_s=40.0))  # fmt: skip
    fast = SearchRow("ub1-t1", "-ub 1 -t 1", False,
                     cert=seen("GREEN", promotable=True, concurrent_tokens_per_s=50.0))  # fmt: skip
    unpromotable = replace(fast, name="x", cert=seen("GREEN", concurrent_tokens_per_s=90.0))
    said = answer([defaults, slow, fast, unpromotable])
    assert said.fastest_green == "ub1-t1" and said.control_red is True
    assert vs_default(fast, defaults) == 0.625
    invariant = replace(defaults, cert=seen("GREEN"))
    words = answer([invariant, slow]).words
    assert any("invariant at its defaults" in w for w in words)


def test_without_a_green_the_answer_names_the_best_amber_and_the_longest_that_held() -> None:
    rows = [
        SearchRow("defaults", "(defaults)", True, cert=seen("RED", first_drift_position=257,
                                                            bitwise_equal_up_to=256)),
        SearchRow("kv-f32", "-ctk f32 -ctv f32", False,
                  cert=seen("AMBER", concurrent_tokens_per_s=30.0, bitwise_equal_up_to=512)),
    ]  # fmt: skip
    said = answer(rows)
    assert said.fastest_green is None and said.best_amber == "kv-f32"
    assert said.holds_longest == ("kv-f32", 512)
    assert said.words[0] == "no configuration is promotable GREEN"


def golden_rows() -> list[SearchRow]:
    certs = Path("/certs")
    return [
        SearchRow("defaults", "(defaults)", True,
                  probe=seen("RED", longest=1002, first_drift_position=257),
                  cert=seen("RED", longest=1010, first_drift_position=257, speedup=1.72,
                            concurrent_tokens_per_s=74.0),
                  certs=str(certs / "defaults")),
        SearchRow("ub1", "-ub 1", False, probe=seen("UNVERIFIED", longest=1002),
                  cert=seen("GREEN", promotable=True, longest=1004, speedup=0.9,
                            concurrent_tokens_per_s=43.1, reused=True),
                  certs=str(certs / "ub1"),
                  deploy=("/bin/llama-server", "--model", "/m.gguf", "--parallel", "4"),
                  interleaved=Interleaved((Round(True, 41.0, 70.0), Round(False, 42.0, 60.0),
                                           Round(True, 40.0, 66.0)), 3, "k")),
        # A GREEN whose interleaved rounds the budget left out: the two certs' figure, marked.
        SearchRow("ub1-t1", "-ub 1 -t 1", False, probe=seen("UNVERIFIED", longest=1002),
                  cert=seen("GREEN", promotable=True, longest=1004, speedup=0.8,
                            concurrent_tokens_per_s=40.7),
                  certs=str(certs / "ub1-t1")),
        SearchRow("fa-on", "-fa on", False,
                  probe=seen("RED", longest=1002, first_drift_position=261),
                  certs=str(certs / "fa-on")),
        SearchRow("t1", "-t 1", False, not_run="budget 600 s: stopped after 580 s",
                  certs=str(certs / "t1")),
    ]  # fmt: skip


def test_the_search_table_golden() -> None:
    record = search_record("gemma-3-270m-q4_k_m", 1024, 4, "llama-server", golden_rows(),
                           stopped="budget 600 s: stopped after 580 s", wall_s=580.0)  # fmt: skip
    line = "batch-invariance serve --certs /certs/ub1 --allow-unsigned -- /bin/llama-server ..."
    check_golden("search.txt", search_text(record, "/certs/search.json", line))


def test_the_interleaved_rounds_turn_the_order_and_read_the_median_of_their_ratios() -> None:
    assert [round_order(i) for i in range(4)] == [True, False, True, False]
    rounds = (Round(True, 30.0, 60.0), Round(False, 50.0, 50.0), Round(True, 45.0, 50.0))
    assert [r.ratio for r in rounds] == [0.5, 1.0, 0.9]
    found = Interleaved(rounds, 3, "k")
    assert found.median == 0.9 and found.complete
    # A side that lost a request has no ratio: the median is over the rounds both measured.
    lost = Interleaved((*rounds[:2], Round(True, None, 50.0)), 3, "k")
    assert lost.rounds[2].ratio is None and lost.median == 0.75
    assert Interleaved((), 3, "k", stopped="budget").median is None
    assert not Interleaved(rounds[:2], 3, "k").complete


def test_the_fastest_green_is_ranked_by_the_interleaved_medians_where_every_green_has_one() -> None:
    def green(name: str, rate: float, ratios: tuple[float, ...] | None) -> SearchRow:
        found = None
        if ratios is not None:
            found = Interleaved(tuple(Round(True, x, 1.0) for x in ratios), 3, "k")
        cert = seen("GREEN", promotable=True, concurrent_tokens_per_s=rate)
        return SearchRow(name, name, False, cert=cert, interleaved=found)

    # b's cert ran on a fast moment of the host; beside the defaults, a is the faster.
    a, b = green("a", 40.0, (0.7, 0.8, 0.75)), green("b", 50.0, (0.6, 0.65, 0.6))
    assert answer([a, b]).fastest_green == "a"
    # Where one GREEN has no interleaved figure, the certs' figures rank them all.
    assert answer([a, green("b", 50.0, None)]).fastest_green == "b"
