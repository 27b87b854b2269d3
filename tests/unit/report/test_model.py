"""The report model and its SVG plot: pure functions over cert JSON."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import batch_invariance
from batch_invariance.report.divergence import TIE_FLIP_MARGIN, flip_kind
from batch_invariance.report.model import LoadedCert, Signature, build_report, rate_figure
from batch_invariance.report.plot import frame_for, nice_ceiling, nice_rate_max, rate_plot
from batch_invariance.report.views import answer_length_text, n_buys_text, signature_text
from tests.support.report_fixtures import green_data, loaded, red_data, sweep_inputs

PKG = Path(batch_invariance.__file__).parent
PURE_REPORT_MODULES = (
    "fields", "divergence", "model", "plot", "views", "html", "markdown", "summary",
)  # fmt: skip
IO_MODULES = {"os", "pathlib", "subprocess", "socket", "requests", "time", "sys", "sigstore"}


@pytest.mark.parametrize("name", PURE_REPORT_MODULES)
def test_report_views_and_model_are_pure(name: str) -> None:
    tree = ast.parse((PKG / "report" / f"{name}.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for mod in mods:
                assert (mod or "").split(".")[0] not in IO_MODULES, f"{name} imports {mod}"
                assert not (mod or "").startswith("batch_invariance.report.load")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in {"open", "print"}, f"{name} calls {node.func.id}"


def test_groups_by_model_and_ctx_ordered_by_n_and_invalid_named() -> None:
    report = build_report(sweep_inputs())
    assert [(g.model, g.ctx) for g in report.groups] == [("other", 1024), ("tiny", 2048)]
    assert [c.n for c in report.groups[1].cells] == [2, 4, 8]
    assert [c.verdict for c in report.groups[1].cells] == ["GREEN", "GREEN", "RED"]
    assert [bad.origin for bad in report.invalid] == ["broken__ctx2048__N4.json"]
    assert "digest mismatch" in report.invalid[0].problem


def test_a_cert_missing_a_needed_field_is_invalid_not_a_crash() -> None:
    data = green_data(2)
    del data["model"]
    report = build_report([loaded(data, "x.json"), loaded(green_data(4), "y.json")])
    assert [c.origin for c in report.cells] == ["y.json"]
    assert report.invalid[0].origin == "x.json"
    assert "'model'" in report.invalid[0].problem


def test_two_certs_for_one_cell_are_both_shown_and_flagged() -> None:
    report = build_report([loaded(green_data(2), "a.json"), loaded(green_data(2), "b.json")])
    assert [(c.origin, c.duplicate) for c in report.cells] == [("a.json", True), ("b.json", True)]


def test_rate_is_a_bound_without_divergence_and_an_interval_with_it() -> None:
    bound = rate_figure(green_data(2, bound=0.05))
    assert bound is not None and bound.kind == "bound"
    assert (bound.low, bound.high) == (0.0, 0.05)
    assert bound.text == "<= 0.05 (95% bound, 64 hot comparisons)"
    distinct = rate_figure(green_data(2, bound=0.1875, distinct=16))
    assert distinct is not None and distinct.text == "<= 0.1875 (95% bound, 16 distinct prompts)"
    observed = rate_figure(red_data(4))
    assert observed is not None and observed.kind == "observed"
    assert (observed.low, observed.value, observed.high) == (0.0098, 0.046875, 0.1309)
    assert observed.text == "0.04688 [0.0098, 0.1309] (3 of 64 comparisons)"
    assert rate_figure({"sensitivity": {}}) is None


def test_throughput_and_answer_length_show_when_present_else_not_measured() -> None:
    report = build_report(sweep_inputs())
    n2, n4, n8 = report.groups[1].cells
    assert n_buys_text(n2) == "N=2 buys 1.75x here" and n_buys_text(n4) == "N=4 buys 3.00x here"
    assert n_buys_text(n8) == "throughput not measured"
    assert answer_length_text(n2) == "12 / 40 / 96 (min/median/max), 25% cut by the token budget"
    assert answer_length_text(n4) == "not measured"


def test_divergent_ids_split_at_the_first_divergent_token_with_passes_and_margin() -> None:
    cell = build_report([loaded(red_data(8), "r.json")]).cells[0]
    by_id = {d.test_id: d for d in cell.divergent}
    assert sorted(by_id) == ["q1", "q2", "q3"]
    q1 = by_id["q1"]
    # Pass 3 was token-only for q1; the invariant passes are the ones it diverged in.
    assert q1.passes == (0, 2) and q1.shown_pass == 0 and q1.first_token == 2
    assert (q1.a.before, q1.a.token, q1.a.after) == ("The answer", " is", " 42.")
    assert (q1.c.before, q1.c.token, q1.c.after) == ("The answer", " was", " 42.")
    assert q1.a.margin == 0.02 and q1.c.margin is None
    assert q1.flip.startswith("tie flip")
    q2 = by_id["q2"]
    assert q2.a.token is None and q2.a.before == "Paris" and q2.c.before == "Rome"
    assert q2.flip == "margin not recorded"
    q3 = by_id["q3"]
    assert q3.kind == "token_only" and q3.passes == (3,)


def test_the_margin_falls_back_to_the_trial_top_margins() -> None:
    data = red_data(8)
    for row in data["divergence_report"]["AC"]["per_id"]:
        row["x_top_margin"] = None
    q1 = build_report([loaded(data, "r.json")]).cells[0].divergent[0]
    assert q1.a.margin == 0.02


def test_flip_kind_threshold() -> None:
    assert flip_kind(None, None) == "margin not recorded"
    assert flip_kind(TIE_FLIP_MARGIN / 2, 3.0).startswith("tie flip")
    assert flip_kind(TIE_FLIP_MARGIN, None).startswith("confident flip")


def test_long_answers_are_clipped_around_the_token() -> None:
    data = red_data(8)
    data["evidence"]["a"]["q1"]["tokens"] = ["a"] * 1000 + ["X"] + ["b"] * 1000
    data["divergence_report"]["AC"]["per_id"][0]["first_divergent_token"] = 1000
    q1 = build_report([loaded(data, "r.json")]).cells[0].divergent[0]
    assert q1.a.token == "X" and len(q1.a.before) < 300 and len(q1.a.after) < 300
    assert q1.a.before.startswith("…") and q1.a.after.endswith("…")


def test_signature_states_read_as_words() -> None:
    cell = build_report([loaded(green_data(2), "g.json")]).cells[0]
    assert signature_text(cell) == "unsigned (no bundle)"
    for state, word in (
        ("present", "bundle present, not verified"),
        ("verified", "signed, verified (who)"),
        ("failed", "signature FAILED: who"),
    ):
        signed = LoadedCert("g.json", green_data(2), None, True, Signature(state, "who"))  # type: ignore[arg-type]
        assert signature_text(build_report([signed]).cells[0]) == word


def test_plot_axes_round_up() -> None:
    assert nice_rate_max(0.0) == 0.01 and nice_rate_max(0.13) == 0.2 and nice_rate_max(0.9) == 1.0
    assert nice_ceiling(120.0) == 200.0 and nice_ceiling(70.0) == 100.0 and nice_ceiling(0) == 1.0


def test_plot_draws_each_interval_from_low_to_high_and_throughput_only_when_measured() -> None:
    cells = build_report(sweep_inputs()).groups[1].cells
    frame = frame_for(cells)
    assert frame.slots == (2, 4, 8) and frame.rate_max == 0.2 and frame.throughput_max == 200.0
    svg = rate_plot(cells, "t")
    red = cells[2]
    assert red.rate is not None
    bar = (
        f'<line class="interval-bar" data-n="8" x1="{frame.x(8):.1f}" '
        f'y1="{frame.y_rate(red.rate.low):.1f}" x2="{frame.x(8):.1f}" '
        f'y2="{frame.y_rate(red.rate.high):.1f}"'
    )
    assert bar in svg
    assert frame.y_rate(0.0) > frame.y_rate(red.rate.high)  # higher rate is drawn higher up
    assert svg.count('class="rate-point"') == 3
    assert svg.count('class="throughput-point"') == 2  # N=8 measured no throughput
    assert "throughput not measured" not in svg
    bare = rate_plot(build_report(sweep_inputs()).groups[0].cells, "t")
    assert "throughput not measured" in bare and "throughput-line" not in bare


def test_a_failed_signature_takes_promotion_away() -> None:
    ok = LoadedCert("g.json", green_data(2), None, True, Signature("verified", "who"))
    bad = LoadedCert("h.json", green_data(4), None, True, Signature("failed", "mismatch"))
    cells = build_report([ok, bad]).cells
    assert [c.promotable for c in cells] == [True, False]
