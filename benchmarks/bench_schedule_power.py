"""The defaults before and after issue 42, side by side: requests, wall time and detection power.

For the zero-config cell of the Action on the embedded pair (the length ladder of a 256-token
slot, N 4, ``-ub 1``, raw completions, 128 tokens), each schedule's row gives

* its requests: A (serial, each request once), the C passes, and B (serial, on the N-slot
  server; on a clean cell on every id). A' runs only when B differs from A and is left out;
* its wall time: **measured** when ``--live`` ran it here, else **estimated** as requests x
  the seconds per request (``--s-per-request``, or the per-request time the live run of the
  new defaults measured; a run is said to be which);
* its detection power at p = 0.01, 0.03 and 0.1 under both bounds of docs/power.md: per prompt
  (all runs of a prompt change together: what a GREEN can promise) and per run (each run
  changes on its own: the best case).

``--live`` runs the after-defaults cell once with ``run-live`` and the Action's defaults, on the
embedded pair (or ``--server-bin``/``--model``), and reads the verdict and the arms from its
cert. Run it alone (under the shared lock where several people share the host): two
llama-servers on two cores slow each other.

    python benchmarks/bench_schedule_power.py                       # estimates only
    python benchmarks/bench_schedule_power.py --live --out-dir /tmp/power-bench

Measured on 2026-12-06 with ``--live`` on the 2-core dev VM with nothing else running (1-minute
load average 1.8 at the start): GREEN, promotable, 128 requests in 312 s (2.44 s per request).
Earlier the same day, on the host loaded by other test runs (load 2.9-4.8): 689 s.

======  ============  ========  ===================================  =====================
        schedule      requests  wall                                 power p=0.01 (prompt
                                                                     / run)
======  ============  ========  ===================================  =====================
before  32 x 3 x 8    960       est. 39 min at 2.44 s/request        0.28 / >0.99
after   32 x 1 x 2    128       5.2 min, measured (idle host)        0.28 / 0.47
======  ============  ========  ===================================  =====================

At p = 0.03 and 0.1 the per-prompt power is 0.62 and 0.97 for both; docs/power.md has the
model and the full tables.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedded_pair import add_pair_arguments, pair_from

from batch_invariance.core.power import (
    PER_PROMPT,
    PER_RUN,
    RATES,
    Schedule,
    power_text,
    sample_miss,
)
from batch_invariance.profiles.ladder import LADDER_PROMPTS
from batch_invariance.service.request import ACTION_DEFAULTS

#: The defaults before issue 42 (run-live, sweep, the Action): 32 prompts x 3 reps x 8 passes.
BEFORE = Schedule(LADDER_PROMPTS, 3, 8)
#: The zero-config Action cell of issue 42.
CTX, PARALLEL = 256, 4
#: Seconds per request of the committed scope GREEN (32 x 1 x 2, 128 requests in 278 s on 2
#: idle cores, docs/numerics.md): the estimate when nothing ran here.
COMMITTED_S_PER_REQUEST = 278.0 / 128


@dataclass(frozen=True)
class Row:
    name: str
    schedule: Schedule
    requests: int
    wall_s: float
    how: str


def requests_of(s: Schedule) -> int:
    """A + C + B on a clean cell: ``P R + P R K + P R`` (A' left out)."""
    return s.prompts * s.reps * (2 + s.passes)


def after() -> Schedule:
    m = ACTION_DEFAULTS.measurement
    return Schedule(LADDER_PROMPTS, m.reps, m.gate_passes, PARALLEL)


def live_cell(opts: argparse.Namespace) -> tuple[float, dict[str, Any]]:
    """The after-defaults cell, run once: its wall time and its cert."""
    pair = pair_from(opts)
    out: Path = opts.out_dir
    argv = [
        sys.executable, "-m", "batch_invariance", "run-live", "--server-bin", str(pair.server_bin),
        "--model", str(pair.model), "--ctx", str(CTX), "--parallel", str(PARALLEL),
        "--endpoint", "completions", "--server-flag=-ub", "--server-flag=1",
        "--out-dir", str(out),
    ]  # fmt: skip
    load = os.getloadavg()[0]
    started = time.monotonic()
    done = subprocess.run(argv, check=False)
    wall = time.monotonic() - started
    certs = sorted(out.glob(f"*__N{PARALLEL}.json"))
    if not certs:
        raise SystemExit(f"run-live wrote no cert (exit {done.returncode})")
    cert = json.loads(certs[-1].read_text())
    print(f"live: exit {done.returncode}, {wall:.0f} s, load average {load:.2f} at the start")
    return wall, cert


def served(cert: dict[str, Any]) -> int:
    """The requests a cert's evidence holds: A, A', B and every C pass."""
    ev = cert["evidence"]
    arms = [ev.get("a") or {}, ev.get("a_repeat") or {}, ev.get("b") or {}]
    return sum(map(len, arms)) + sum(len(p["trials"]) for p in ev.get("c_passes") or [])


def figures(s: Schedule) -> str:
    runs = (PER_PROMPT, PER_RUN)
    cells = [power_text(sample_miss(s.prompts, s.runs, r, m)) for m in runs for r in RATES]
    return " | ".join(cells)


def table(rows: list[Row]) -> list[str]:
    heads = " | ".join(f"{m.name}, p = {r:g}" for m in (PER_PROMPT, PER_RUN) for r in RATES)
    lines = [
        f"| defaults | schedule | requests (A + C + B) | wall | {heads} |",
        "|---|---|---|---|" + "---|" * (2 * len(RATES)),
    ]
    for r in rows:
        s = r.schedule
        lines.append(
            f"| {r.name} | {s.prompts} x {s.reps} x {s.passes}, N {s.parallel} | {r.requests} | "
            f"{r.wall_s / 60:.1f} min ({r.how}) | {figures(s)} |"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--live", action="store_true", help="run the after-defaults cell once")
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/bench-schedule-power"))
    ap.add_argument("--s-per-request", type=float, default=None,
                    help="seconds per request for the estimates (default: the live run's, "
                         "else the committed scope GREEN's)")  # fmt: skip
    add_pair_arguments(ap)
    opts = ap.parse_args()
    new, old = after(), BEFORE
    rows: list[Row] = []
    per_request = opts.s_per_request or COMMITTED_S_PER_REQUEST
    how = "estimated at {:.2f} s/request".format
    if opts.live:
        wall, cert = live_cell(opts)
        n = served(cert)
        per_request = opts.s_per_request or wall / n
        print(f"live: {cert['verdict']}, {n} requests, {wall / n:.2f} s per request")
        rows.append(Row("after", new, n, wall, "measured"))
    else:
        rows.append(Row("after", new, requests_of(new), requests_of(new) * per_request,
                        how(per_request)))  # fmt: skip
    rows.insert(0, Row("before", old, requests_of(old), requests_of(old) * per_request,
                       how(per_request)))  # fmt: skip
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
