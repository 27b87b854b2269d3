"""An independent check of a search's probes: replay each probe's prompts with plain HTTP.

For every configuration of a finished search (``D/search.json``) whose probe ran, this runs
benchmarks/probe_scope.py (its own two llama-servers and plain ``requests`` to
``/v1/completions``, serial then N at a time, no project code) on the prompts that probe sent
(``D/probes/<config>/workset.json``) with that configuration's flags, and prints whether the
two agree: the probe rejected (RED or AMBER) and the plain replay saw drift, or neither did.

    flock /tmp/bi-live.lock python benchmarks/search_probe_check.py D [--configs a,b]

The search must have run with ``--endpoint completions`` (what probe_scope.py sends). The
replay co-batches each wave of N prompts once, where the probe ran two C passes, so a probe
that rejected on a rare co-batching may see no drift in one replay: run it again before
calling that a disagreement. A unified-KV configuration is skipped (probe_scope.py starts a
split cache).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: The summary line probe_scope.py ends with.
SUMMARY = re.compile(r"rows (\d+): drift in (\d+), answer changed in (\d+)")


def replay(cert: dict[str, Any], workset: Path, flags: list[str]) -> tuple[int, int] | None:
    """(rows with drift, rows with a changed answer) by the plain replay, or None."""
    prov = cert["provenance"]
    argv = [sys.executable, str(HERE / "probe_scope.py"),
            "--server-bin", prov["server_binary"]["path"], "--model", prov["model_file"]["path"],
            "--workset", str(workset), "--ctx", str(cert["ctx"]),
            "--parallel", str(cert["dispatch_n"]),
            "--n-predict", str(prov["request_template"].get("max_tokens", 128)),
            "--", *flags]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    print(out, end="")
    found = SUMMARY.search(out)
    return None if found is None else (int(found.group(2)), int(found.group(3)))


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--configs", default=None)
    opts = ap.parse_args()
    record = json.loads((opts.out_dir / "search.json").read_text())
    wanted = None if opts.configs is None else set(opts.configs.split(","))
    agree = disagree = 0
    for row in record["rows"]:
        probe = row.get("probe")
        if probe is None or (wanted is not None and row["config"] not in wanted):
            continue
        if "kv=unified" in row["options"]:
            print(f"{row['config']}: skipped (unified KV)")
            continue
        cert = json.loads(Path(probe["path"]).read_text())
        workset = Path(probe["path"]).parent / "workset.json"
        print(f"== {row['config']} ({row['options']}): probe {probe['verdict']}")
        seen = replay(cert, workset, list(cert["provenance"].get("server_flags") or []))
        if seen is None:
            print(f"{row['config']}: the replay printed no summary")
            continue
        rejected = probe["verdict"] in ("RED", "AMBER") or probe["first_drift_position"] is not None
        same = rejected == (seen[0] > 0)
        agree += same
        disagree += not same
        print(f"{row['config']}: probe {'rejected' if rejected else 'did not reject'}; plain "
              f"replay drift in {seen[0]} row(s): {'agree' if same else 'DISAGREE'}")  # fmt: skip
    print(f"agree {agree}, disagree {disagree}")
    return 0 if disagree == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
