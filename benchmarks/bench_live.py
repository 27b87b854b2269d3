"""Harness overhead of a live cell on the embedded default.

Runs one real cell (provisioning the pair first) and prints, per arm, the wall time the
harness spent against what the server itself reports (prompt + predict time), plus model
load time and the number of server launches. Overhead = cell wall - (load + server time of
the serial arms + wall of the concurrent passes, where the server works on N requests at
once and its per-request times overlap).

Usage: python benchmarks/bench_live.py [--out-dir DIR] [--n-predict K] [--gate-passes T]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from batch_invariance.cli import build_parser
from batch_invariance.commands.cell_options import request_from_args
from batch_invariance.engines.provision import provision
from batch_invariance.run.live import run_live_cell

DEMO = Path(__file__).resolve().parents[1] / "src/batch_invariance/data/worksets/demo.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--gate-passes", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    opts = ap.parse_args(argv)
    pair = provision()
    out_dir = opts.out_dir or Path(tempfile.mkdtemp(prefix="bench-live-"))
    args = build_parser().parse_args(
        [
            "run-live",
            "--server-bin", str(pair.server_bin),
            "--model", str(pair.model),
            "--workset", str(DEMO),
            "--ctx", str(opts.ctx),
            "--parallel", str(opts.parallel),
            "--gate-passes", str(opts.gate_passes),
            "--reps", "1",
            "--n-predict", str(opts.n_predict),
            "--out-dir", str(out_dir),
        ]
    )  # fmt: skip
    outcome = run_live_cell(request_from_args(args))
    run = outcome.run
    launches = outcome.launcher.launches
    load_s = sum(r.ready_s or 0.0 for r in launches)
    alive_s = sum(r.alive_s or 0.0 for r in launches)
    print(f"cell: N={run.plan.parallel} items={len(run.plan.items)} "
          f"n_predict={run.plan.n_predict} passes={run.plan.gate_passes}")  # fmt: skip
    print(f"verdict: {outcome.finished.cert.verdict} ({outcome.finished.cert.status})")
    loads = ", ".join(f"{r.arm} {r.ready_s:.2f}s" for r in launches if r.ready_s is not None)
    print(f"server launches: {len(launches)}; model load (spawn -> /health 200): {loads}")
    print(f"{'arm':<10} {'wall_s':>8} {'server_s':>9} {'overhead':>9}")
    accounted = load_s
    for s in run.arm_stats:
        server_s = (s.prompt_ms + s.predicted_ms) / 1000.0
        name = s.arm if s.pass_index is None else f"{s.arm}[{s.pass_index}]"
        if s.pass_index is None:
            # Serial: one request at a time, so server time is directly comparable.
            busy = server_s
            note = f"{(s.wall_s - busy) / s.wall_s * 100:8.1f}%"
        else:
            # Concurrent: per-request server times overlap; the server is busy the whole pass
            # when every slot is fed, so compare against an ideal of server_s / N.
            busy = min(s.wall_s, server_s / run.plan.parallel)
            note = f"{(s.wall_s - busy) / s.wall_s * 100:8.1f}%*"
        accounted += busy if s.pass_index is None else s.wall_s
        print(f"{name:<10} {s.wall_s:8.2f} {server_s:9.2f} {note:>9}")
    overhead = run.wall_s - accounted
    print(f"cell wall {run.wall_s:.2f}s; launches alive {alive_s:.2f}s; load {load_s:.2f}s")
    print(
        f"harness overhead (cell wall - load - serial server time - concurrent pass wall): "
        f"{overhead:.2f}s = {overhead / run.wall_s * 100:.1f}% of the cell (target < 5%)"
    )
    print("* concurrent: wall vs summed server time / N (requests overlap; tail imbalance)")
    print(f"cert: {outcome.finished.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
