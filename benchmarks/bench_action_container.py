"""The Action in its container on the cell a workflow leaves it: wall time, verdict, power line.

Issue 42's figure: the Action's entry point as a runner runs it (``action/run-container.sh``,
the image built from the Dockerfile), given only the server, the model, ctx 256 per slot,
N 4 and ``-ub 1``: no work-set (the length ladder), the default schedule, raw completions by
``endpoint: auto``. It must end GREEN and promotable in at most 10 minutes on 2 idle cores,
with a power statement in the job summary. The server and model are the provisioned embedded
pair, mounted read-only from outside the workspace as a runner keeps them (``server-dir``,
``models-dir``); the image is built once (``BI_BUILD_ONLY``) and its build time is printed
apart from the cell's.

Needs a Docker engine (``source docker/engine.sh; engine_up``) and, on this host, the
debootstrapped base (``BI_BASE_IMAGE=batch-invariance-base:bookworm``, as ``.ci/docker-stage``
builds it). Run it alone: two llama-servers on two cores slow each other.

    python benchmarks/bench_action_container.py --out-dir /tmp/action-bench

Measured on 2026-12-06 on the 2-core dev VM with nothing else running: GREEN, promotable,
exit 0, in 310.3 s (A 72.5 s, C 74.7 and 79.4 s, B 79.9 s: 128 requests), the image cached;
the summary's power line: "32 distinct prompts and 64 co-batched runs catch a cell that
changes 1 answer (or drifts 1 row) in 100 with probability 0.28 (3 in 100: 0.62; 10 in 100:
0.97) if a prompt's runs change together, 0.47 (0.86; >0.99) if each run changes on its own".
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from embedded_pair import add_pair_arguments, pair_from  # noqa: E402

from tests.docker.runner_job import SCRIPT, Job, base_env, new_job  # noqa: E402
from tests.unit.action.test_entrypoint import parse_github_output  # noqa: E402

TARGET_S = 600.0
INPUTS = {
    "mode": "live",
    "server-bin": "llama-server",
    "ctx": "256",
    "parallel": "4",
    "server-flags": "-ub\n1",
    "sign": "false",
    "upload": "false",
}


def _outputs(job: Job) -> dict[str, str]:
    return parse_github_output(job.output.read_text(encoding="utf-8"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pair_arguments(parser)
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args()
    pair = pair_from(args)
    root = args.out_dir / "runner"
    shutil.rmtree(root, ignore_errors=True)
    job = new_job(root)
    builds, models = root / "opt" / "llama", root / "srv" / "models"
    builds.mkdir(parents=True)
    models.mkdir(parents=True)
    shutil.copy2(pair.server_bin, builds / "llama-server")
    shutil.copy2(pair.model, models / pair.model.name)

    started = time.monotonic()
    build = subprocess.run(
        ["bash", str(SCRIPT)], env={**base_env(), "BI_BUILD_ONLY": "1"},
        capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    if build.returncode:
        print(build.stdout[-2000:] + build.stderr[-2000:])
        return 1
    print(f"image built or reused in {time.monotonic() - started:.1f} s")

    inputs = {**INPUTS, "server-dir": str(builds), "models-dir": str(models),
              "model": pair.model.name}  # fmt: skip
    started = time.monotonic()
    proc = job.run(timeout=3600, **inputs)
    wall = time.monotonic() - started
    (args.out_dir / "action.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    summary = job.summary.read_text(encoding="utf-8")
    (args.out_dir / "summary.md").write_text(summary, encoding="utf-8")
    out = _outputs(job)
    cert_path = job.workspace / out.get("cert-path", "missing")
    requests = "?"
    if cert_path.is_file():
        shutil.copy2(cert_path, args.out_dir / cert_path.name)
        arms = json.loads(cert_path.read_text(encoding="utf-8"))["provenance"].get("arms", [])
        requests = str(sum(int(arm.get("n_requests", 0) or 0) for arm in arms)) or "?"
    power = [line.strip() for line in summary.splitlines() if "power" in line.lower()]
    print(f"the Action in its container: {wall:.1f} s (target {TARGET_S:.0f} s), exit "
          f"{proc.returncode}, verdict {out.get('verdict')}, promotable {out.get('promotable')}, "
          f"requests {requests}")  # fmt: skip
    print("summary's power statement: " + (" | ".join(power) if power else "NONE"))
    green = out.get("verdict") == "GREEN" and out.get("promotable") == "true"
    return 0 if green and wall <= TARGET_S and power else 1


if __name__ == "__main__":
    raise SystemExit(main())
