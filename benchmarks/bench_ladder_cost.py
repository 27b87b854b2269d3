"""What measuring the whole slot costs: the default demo cell (the length ladder of a
1024-token slot, default flags, stop on RED) against the 32-prompt cell it replaced (the
bundled completion openings, four C passes), on the embedded pair. Prints each cell's wall
time, its arms and the ratio. Run it alone: two llama-servers on two cores slow each other.

    python benchmarks/bench_ladder_cost.py --out-dir /tmp/ladder-cost
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from batch_invariance.cache_dir import cache_root
from batch_invariance.provision.embedded import provision
from batch_invariance.run.workset import bundled_workset_path


def _cell(argv: list[str], out: Path) -> tuple[float, dict[str, object]]:
    started = time.monotonic()
    subprocess.run(argv, check=False, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - started
    (cert,) = out.glob("*__N4.json")
    return wall, json.loads(cert.read_text())


def _arms(cert: dict[str, object]) -> str:
    prov = cert["provenance"]
    assert isinstance(prov, dict)
    arms = prov.get("arms") or []
    return ", ".join(
        f"{a['arm']}{'' if a.get('pass') is None else a['pass']} {a['wall_s']:.0f} s" for a in arms
    )


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out-dir", type=Path, required=True)
    args = p.parse_args()
    got = provision(cache_root(), allow_build=False)
    new_out, old_out = args.out_dir / "ladder", args.out_dir / "openings"
    cli = [sys.executable, "-m", "batch_invariance"]
    new_wall, new = _cell([*cli, "demo", "--out-dir", str(new_out)], new_out)
    old_argv = [
        *cli, "run-live", "--server-bin", str(got.server_bin), "--model", str(got.model),
        "--workset", str(bundled_workset_path("demo_completions")), "--ctx", "1024",
        "--parallel", "4", "--gate-passes", "4", "--reps", "1", "--n-predict", "96",
        "--endpoint", "completions", "--out-dir", str(old_out),
    ]  # fmt: skip
    old_wall, old = _cell(old_argv, old_out)
    for name, wall, cert in (("32 openings", old_wall, old), ("length ladder", new_wall, new)):
        scope = cert.get("sequence_scope") or {}
        assert isinstance(scope, dict)
        print(
            f"{name}: {cert['verdict']} in {wall:.0f} s ({_arms(cert)}); sequences up to "
            f"{scope.get('longest')} of {scope.get('slot_ctx')}"
        )
    print(f"cost ratio (ladder / openings): {new_wall / old_wall:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
