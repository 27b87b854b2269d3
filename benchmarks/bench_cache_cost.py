"""What the prompt-cache arm costs: one cell with ``--cache-arm`` against the same cell without.

Issue target: a cell with the cache arm costs at most 1.15x today's cell on the embedded
default. The cell is the bundled ``cache_conversations`` work-set (16 prompts, four
conversations of four turns behind one shared preamble), raw completions, ctx 1024, N 4,
``--gate-passes`` P (default 4), one rep, 64 tokens, A' on. Both cells run on the same
embedded llama-server and Gemma 3 270M, in rounds whose order rotates (``plain, cache`` then
``cache, plain``), so a drift of the host's speed is not charged to one side.

What pays for the arm: when every C pass equals A bitwise, B (serial on the N-slot server)
runs on a seeded sample of ids instead of all of them (``core.schedule``); when C already
differs, B runs on the divergent ids in both cells, so the arm's own pass and its server's
launch are the whole difference there.

Usage: python benchmarks/bench_cache_cost.py [--rounds R] [--gate-passes P]
       [--server-flag=F ...] [--server-bin S --model M] [--smoke]

``--server-flag=-ub --server-flag=1`` gives the clean cell (C equals A on this pair), the one
where B runs on the sample. It prints each run, the ratio per round and its median, and the
arms' wall times of the last run of each side.

Measured on 2026-12-03 on the 2-core dev VM, nothing else running, default flags,
``--rounds 2 --gate-passes 4`` (14.5 min in all):

=====  ===========  ===========  ========  ==============================================
round  plain        cache        ratio     order, and what differed
=====  ===========  ===========  ========  ==============================================
1        228.2 s      219.4 s     0.96x    plain, cache (plain's A took 63.9 s, cache's 38.0)
2        196.7 s      221.0 s     1.12x    cache, plain
median                            1.04x    target <= 1.15
=====  ===========  ===========  ========  ==============================================

Every run RED ``co_batching`` (co-batching changes answers on this pair with default flags),
so B ran on the divergent ids in both cells (27.7-33.6 s) and the arm's whole cost was its one
pass (21.6 and 25.0 s, 12 of 16 requests reusing the cache: every later turn, no first turn)
and a 2 s launch. The host's speed moved by more than that within the hour (plain's arm A took
63.9 s in round 1 and 39.4 s in round 2), which is why the rounds rotate and the median is
quoted. A clean cell (every C pass equal to A) pays the arm with B on a sample of
max(8, n/4) ids instead of all n; on this cache-shaped work-set even ``-ub 1`` is not clean
(the live ``-ub 1`` cell drifted on 27 of 96 rows under co-batching), so that branch was not
measured here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from embedded_pair import add_pair_arguments, pair_from

from batch_invariance.core.evidence import GatePolicy
from batch_invariance.core.plan import Measurement
from batch_invariance.run.workset import bundled_workset_path
from batch_invariance.service.live import LiveOutcome, prepare, run_live_cell
from batch_invariance.service.request import LiveRequest

TARGET = 1.15


@dataclass(frozen=True)
class Run:
    side: str
    wall_s: float
    outcome: LiveOutcome

    def line(self) -> str:
        cert = self.outcome.finished.cert
        arms = ", ".join(
            f"{s.arm if s.pass_index is None else f'{s.arm}[{s.pass_index}]'} {s.wall_s:.1f}"
            for s in self.outcome.run.arm_stats
        )
        cache = cert.prompt_cache
        reuse = (
            f"; reused {cache.reuse.n_reused}/{cache.reuse.n_answered} requests"
            if cache is not None
            else ""
        )
        return (
            f"{self.side:<6} {self.wall_s:7.1f} s  {cert.verdict:<10} "
            f"{cert.divergence_class or '-'}{reuse}  [{arms}]"
        )


def _run(side: str, request: LiveRequest) -> Run:
    t0 = time.monotonic()
    outcome = run_live_cell(prepare(request))
    return Run(side, time.monotonic() - t0, outcome)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pair_arguments(ap)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gate-passes", type=int, default=4)
    ap.add_argument("--server-flag", action="append", default=[], dest="server_flags")
    ap.add_argument("--smoke", action="store_true", help="4 prompts x 8 tokens: the script only")
    ap.add_argument("--out-dir", type=Path, default=None)
    opts = ap.parse_args(argv)
    server, model = pair_from(opts)
    root = opts.out_dir or Path(tempfile.mkdtemp(prefix="bench-cache-cost-"))
    root.mkdir(parents=True, exist_ok=True)
    rows = json.loads(bundled_workset_path("cache_conversations").read_text())
    workset = root / "workset.json"
    workset.write_text(json.dumps(rows[:4] if opts.smoke else rows, indent=1))
    plain = LiveRequest(
        out_dir=None,
        server_bin=server,
        model=model,
        workset=workset,
        ctx=1024,
        parallel=4,
        driver_name="bench",
        server_flags=tuple(opts.server_flags),
        measurement=Measurement(
            gate_passes=opts.gate_passes,
            reps=1,
            n_predict=8 if opts.smoke else 64,
            endpoint="completions",
        ),
        policy=GatePolicy(min_hot_trials=1 if opts.smoke else GatePolicy().min_hot_trials),
    )
    cached = replace(plain, measurement=replace(plain.measurement, cache_passes=1))
    ratios: list[float] = []
    last: dict[str, Run] = {}
    for k in range(opts.rounds):
        order = (("plain", plain), ("cache", cached))
        order = order if k % 2 == 0 else order[::-1]
        walls: dict[str, float] = {}
        for side, request in order:
            run = _run(side, replace(request, out_dir=root / f"{side}-{k}"))
            print(f"round {k + 1} {run.line()}", file=sys.stderr, flush=True)
            walls[side] = run.wall_s
            last[side] = run
        ratios.append(walls["cache"] / walls["plain"])
        print(f"round {k + 1}: cache / plain {ratios[-1]:.2f}x", file=sys.stderr, flush=True)
    flags = " ".join(opts.server_flags) or "default flags"
    n_predict = plain.measurement.n_predict
    print(f"cell: {len(json.loads(workset.read_text()))} prompts x {n_predict} tokens, "
          f"ctx 1024, N 4, {opts.gate_passes} passes, {flags}, {opts.rounds} round(s)")  # fmt: skip
    for run in last.values():
        print("  last " + run.line())
    print(f"cache / plain per round: {', '.join(f'{r:.2f}x' for r in ratios)}")
    print(f"median: {statistics.median(ratios):.2f}x (target <= {TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
