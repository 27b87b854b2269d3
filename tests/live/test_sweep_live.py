"""Live sweep and early stop on the embedded default (Gemma 3 270M, CPU), kept small.

* ``sweep --parallel 2,4``: two certs that verify on their own, a sweep.json, and 3 server
  launches (the shared A server, then one per N; A' would add one, only if a B differed).
* ``run-live --stop-on-red``: 8 demo prompts on the completions endpoint reach RED on this
  pair in fewer passes than the full run would make.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from batch_invariance import exitcodes
from batch_invariance.cert.verify import verify
from batch_invariance.cli import build_parser, main
from batch_invariance.commands.cell_options import request_from_args
from batch_invariance.provision.embedded import Provisioned
from batch_invariance.service.live import prepare, run_live_cell
from tests.support.fakes_live import LOOSE_GATES


def test_a_sweep_over_two_n_writes_two_certs_and_launches_three_servers(
    live_pair: Provisioned, demo_subset: Callable[[int], Path], tmp_path: Path
) -> None:
    out = tmp_path / "sweep"
    code = main(["sweep", "--server-bin", str(live_pair.server_bin),
                 "--model", str(live_pair.model), "--workset", str(demo_subset(4)),
                 "--ctx", "256", "--parallel", "2,4", "--gate-passes", "2", "--reps", "1",
                 "--n-predict", "16", "--min-hot-trials", "1", "--out-dir", str(out),
                 *LOOSE_GATES])  # fmt: skip
    assert code in (exitcodes.PROMOTABLE, exitcodes.RED, exitcodes.NOT_PROMOTABLE)
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["parallel"] == [2, 4] and summary["not_run"] == {}
    assert [c["parallel"] for c in summary["certs"]] == [2, 4]
    a_repeat_ran = False
    for entry in summary["certs"]:
        path = out / entry["file"]
        verification = verify(path)
        assert verification.problems == (), verification.problems
        cert = verification.cert
        assert cert is not None and cert.digest == entry["digest"]
        assert cert.source == "live" and cert.throughput is not None
        schedule = cert.provenance.schedule
        assert schedule is not None and schedule.reference_shared is not None
        assert "shared by the cells N=2, 4" in schedule.reference_shared
        a_repeat_ran = a_repeat_ran or "A_repeat" in (schedule.arms_run or ())
    # One A server for both N, one server per N: 1 + K launches (A' only if a B differed).
    assert summary["server_launches"] == (4 if a_repeat_ran else 3)


def test_stop_on_red_reaches_red_in_fewer_passes_than_a_full_run(
    live_pair: Provisioned, demo_subset: Callable[[int], Path], tmp_path: Path
) -> None:
    # The raw completions endpoint diverges often on this pair (several prompts per pass), so
    # 8 prompts suffice for the first passes to prove RED.
    passes = 4
    args = build_parser().parse_args(
        ["run-live", "--server-bin", str(live_pair.server_bin), "--model", str(live_pair.model),
         "--workset", str(demo_subset(8)), "--endpoint", "completions", "--ctx", "512",
         "--parallel", "4", "--gate-passes", str(passes), "--reps", "1", "--n-predict", "64",
         "--stop-on-red", "--out-dir", str(tmp_path)]
    )  # fmt: skip
    outcome = run_live_cell(prepare(request_from_args(args)))
    cert = outcome.finished.cert
    assert cert.verdict == "RED", cert.decision_reasons
    schedule = cert.provenance.schedule
    assert schedule is not None and schedule.passes_run is not None
    assert schedule.stopped_early is True and schedule.passes_planned == passes
    assert cert.n_passes == schedule.passes_run < passes
    # B ran after the passes, on the proof's divergent ids alone: on this pair the
    # --parallel 4 server reproduces A when serial (AB clean in every measured run).
    divergent = cert.divergence_report.ac.divergent_ids
    assert cert.evidence.b_ids == tuple(divergent) == tuple(sorted(cert.evidence.b))
    assert len(divergent) < 8 and cert.divergence_class == "co_batching"
    b_arm = next(arm for arm in cert.provenance.arms or () if arm["arm"] == "B")
    assert b_arm["n_requests"] == len(divergent)
    assert verify(outcome.finished.path).problems == ()
