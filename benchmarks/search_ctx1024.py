"""The issue-43 search: every llama-server configuration the engine declares (13) for the
embedded pair at ctx 1024 per slot and N 4, on the length ladder, raw completions (so that
benchmarks/search_probe_check.py can replay any probe with plain HTTP).

Target: it finishes within 2 hours on 2 idle cores, the defaults RED, and either a
configuration GREEN over the whole 1024-token slot with the throughput it buys, or the table
says for every configuration why not. A second run with the same --out-dir reuses every cert
already measured, so a run stopped by --budget goes on where it stopped.

Usage (start a real llama-server: run it under the shared lock on a shared host):

    flock /tmp/bi-live.lock python benchmarks/search_ctx1024.py --out-dir D [--budget 2h]
    flock /tmp/bi-live.lock python benchmarks/search_ctx1024.py --out-dir D --budget 60
        (a tiny budget: proves it starts, probes the defaults and stops)

Prints the search's own table, and the wall time of this run.

Measured in full on the dev VM (2026-12-06, 2 cores, niced unit tests beside it): 5,360 s
for the 13 probes and four full certs (its --dry-run ETA said ~12 to ~56 min: it does not know
that -ub 1 feeds prompts one token per ubatch), then 264 s for two interleaved rounds of each
GREEN against the defaults (`batch-invariance search ... --interleave-rounds 2`, every cert
reused). Defaults RED; nine probes rejected; -ub 1 with -fa off, -t 1 or a q8_0 K/V cache GREEN
over 965 of 1024 positions, at 0.57x, 0.46x and 0.56x the defaults' concurrent tokens/s
(examples/search/).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from embedded_pair import add_pair_arguments, pair_from

from batch_invariance.cli import main as cli


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_pair_arguments(ap)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--budget", default="2h", help="wall-time limit (seconds, 90m, 2h)")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--configs", default=None, help="part of the space (default: all 13)")
    ap.add_argument("--dry-run", action="store_true")
    opts = ap.parse_args()
    pair = pair_from(opts)
    argv = ["search", "--server-bin", str(pair.server_bin), "--model", str(pair.model),
            "--ctx", str(opts.ctx), "--parallel", str(opts.parallel), "--endpoint",
            "completions", "--out-dir", str(opts.out_dir), "--budget", opts.budget]  # fmt: skip
    argv += ["--configs", opts.configs] if opts.configs else []
    argv += ["--dry-run"] if opts.dry_run else []
    began = time.monotonic()
    code = cli(argv)
    print(f"benchmark: search exit {code}; this run's wall time {time.monotonic() - began:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
