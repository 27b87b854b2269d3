"""Time the pure core (diff + gates + verdict) on 100,000 ids x 8 C passes.

Run: ``python benchmarks/bench_core.py [--ids N] [--passes T]``. Prints the build time of the
synthetic evidence (not part of the core) and the time of ``decide``, which computes the AC,
AB and BC reports, every gate (including the O(n log n) co-batch coverage) and the verdict.
One id in one pass diverges so the RED path with its per-id row and exact interval is taken.
It then checks linearity (the CPU time per id x pass at a quarter and half the ids, and at
half the passes); ``--no-scaling`` skips that.

The trials carry what a live llama-server run records (a server-reported answer length, the
finish reason, ``timings.cache_n`` 0); ``--bare`` leaves those three out, which is the input
the issue's 9.1 s was measured on (every trial then fails the prompt cache gate and has no
answer length, so those paths carry every id).

Measured 2026-12-01 on the 2-core dev VM with nothing else running, CPU time
(``process_time``), the better of two ``decide`` calls on the same evidence; "before" is main
at a95d0e1 run with this same script, the two run back to back twice:

=================================  ======================  ======================
100,000 ids x 8 passes             before (a95d0e1)        after (this tree)
=================================  ======================  ======================
live-like trials                   6.04 / 6.00 s CPU       2.46 / 2.36 s CPU
``--bare`` trials                  6.04 / 5.97 s CPU       2.49 / 2.62 s CPU
=================================  ======================  ======================

Target met: under 3 s (2.2-2.9 s over twelve runs through the session; the figure moves by
up to 30% with the neighbours' memory traffic on this VM, which is why the margin matters).
Linear: 25,000 / 50,000 / 100,000 ids at 8 passes took 0.54 / 1.21 / 2.33 s (2.7 / 3.0 /
2.9 us per id x pass), and 100,000 ids at 4 passes 1.71 s: about 0.155 s per pass of
100,000 ids on top of about 1.1 s per 100,000 ids for what every cell reads once (A and B
with their agreement keys, the group labels, the distinct-prompt count).

What changed, from the profile (cProfile of ``decide``): the interval sweeps (F1 depth, F3
co-batching) were 1.4 s of C-level map chains and are now numpy array operations
(``core/intervals.py``, 0.2 s); the answer-length median is a numpy partition, not a sort of
800,000 Python ints; the per-arm sets hold the exceptions (ids not scored ok, transport
failures, cache reuse) and are built only when a C-speed count says there are any, where
they used to hold every scored id; a pass whose every trial was co-batched hands over its own
keys view instead of a copy; and A and each pass are compared position by position when they
hold the same ids in the same order (a live run always does: trials follow the work-set).
What is left is reading each trial's attributes once (the agreement keys, 0.5-0.6 s, and the
other columns, 0.7 s): the floor for Trial objects.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from dataclasses import replace
from typing import Any

from batch_invariance.core.diff import compare
from batch_invariance.core.evidence import CellEvidence, GatePolicy, ItemMeta, PassRecord, Trial
from batch_invariance.core.gates import cobatched_flags
from batch_invariance.core.verdict import Verdict, decide


def _trial(test_id: str, sha: str, start: float, end: float, bare: bool = False) -> Trial:
    """A scored trial as a live llama-server run records it: a server-reported answer length,
    the finish reason and ``timings.cache_n`` 0. ``bare`` leaves those three out (the input
    the 9.1 s of the issue was measured on; the prompt cache gate then fails on every trial
    and the answer length is unknown)."""
    # What a live run records on top (left out with ``bare``).
    recorded: dict[str, Any] = {}
    if not bare:
        length = 64 + int(sha[:2], 16) % 33
        recorded = {"completion_tokens": length, "finish_reason": "stop", "timings": {"cache_n": 0}}
    return Trial(
        test_id=test_id,
        score=1.0,
        passed=True,
        extracted_answer=test_id,
        expected_answer=test_id,
        prompt_tokens_measured=32,
        failure_mode="ok",
        content_sha256=sha,
        dispatch_ts=start,
        complete_ts=end,
        **recorded,
    )


def build(n_ids: int, n_passes: int, slots: int = 8, bare: bool = False) -> CellEvidence:
    ids = [f"id{k:06d}" for k in range(n_ids)]
    shas = {t: hashlib.sha256(t.encode()).hexdigest() for t in ids}
    serial = {t: _trial(t, shas[t], float(k), k + 0.5, bare) for k, t in enumerate(ids)}
    passes = []
    for p in range(n_passes):
        # `slots` closed-loop workers: request k runs in wave k // slots, shifted per pass.
        base = 1e6 * (p + 1)
        trials = {
            t: _trial(
                t,
                shas[t],
                base + (k // slots) * 0.2 + (k % slots) * 0.001,
                base + (k // slots) * 0.2 + 0.19,
                bare,
            )
            for k, t in enumerate(ids)
        }
        passes.append(
            PassRecord(
                index=p, trials=trials, server_busy_max=slots, busy_source="slots", order=tuple(ids)
            )
        )
    last = passes[-1]
    victim = ids[n_ids // 2]
    passes[-1] = replace(
        last, trials={**last.trials, victim: replace(last.trials[victim], score=0.0)}
    )
    return CellEvidence(
        items=tuple(ItemMeta(t, family=f"f{k % 7}", fill=(k % 4) / 4) for k, t in enumerate(ids)),
        a=serial,
        a_repeat=None,
        b=dict(serial),
        c_passes=tuple(passes),
    )


def _timed_decide(ev: CellEvidence, runs: int = 2) -> tuple[float, float, Verdict]:
    """(wall s, CPU s, verdict) of the better of ``runs`` :func:`decide` calls; CPU time is
    what a loaded machine cannot inflate by descheduling us."""
    best_wall = best_cpu = float("inf")
    verdict = None
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        verdict = decide(ev, GatePolicy())
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    assert verdict is not None
    return best_wall, best_cpu, verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=100_000)
    parser.add_argument("--passes", type=int, default=8)
    parser.add_argument(
        "--no-scaling", action="store_true", help="skip the linearity check (25k/50k ids, 4 passes)"
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="trials without answer length, finish reason and cache_n (the issue's input)",
    )
    args = parser.parse_args()
    t0 = time.perf_counter()
    ev = build(args.ids, args.passes, bare=args.bare)
    t1 = time.perf_counter()
    ac = compare("AC", ev.a, [(p.index, p.trials) for p in ev.c_passes], ev.items)
    t2 = time.perf_counter()
    wall, cpu, verdict = _timed_decide(ev)
    print(
        f"ids={args.ids} passes={args.passes} comparisons={args.ids * args.passes}"
        f"{' (bare trials)' if args.bare else ''}"
    )
    print(f"build evidence (not core): {t1 - t0:.2f} s")
    print(f"diff AC alone:             {t2 - t1:.2f} s (divergent ids: {ac.n_divergent})")
    print(
        f"decide (AC+AB+BC diff, gates, verdict), best of 2: {wall:.2f} s wall, {cpu:.2f} s CPU "
        f"-> {verdict.status} "
        f"({verdict.divergence_class}), n_hot_trials={verdict.sensitivity.n_hot_trials}"
    )
    per = cpu / (args.ids * args.passes) * 1e6
    print(f"  {per:.2f} us CPU per id x pass")
    if not args.no_scaling:
        # Linear in ids x passes: the CPU time per id x pass should stay about the same.
        del ev
        sizes = [(args.ids // 4, args.passes), (args.ids // 2, args.passes)]
        sizes.append((args.ids, max(1, args.passes // 2)))
        for n_ids, n_passes in sizes:
            wall, cpu, scaled = _timed_decide(build(n_ids, n_passes, bare=args.bare))
            print(
                f"decide {n_ids:>7} ids x {n_passes} passes: {wall:.2f} s wall, {cpu:.2f} s CPU, "
                f"{cpu / (n_ids * n_passes) * 1e6:.2f} us CPU per id x pass -> {scaled.status}"
            )
    # Scaling of the co-batch coverage sweep alone: quadratic would grow ~16x per 4x ids.
    for n in (25_000, 100_000, 400_000):
        spans = [(k * 0.001, k * 0.001 + 0.5) for k in range(n)]
        t4 = time.perf_counter()
        cobatched_flags(spans, 0.005)
        print(f"co-batch coverage sweep, {n:>7} intervals: {time.perf_counter() - t4:.3f} s")


if __name__ == "__main__":
    main()
