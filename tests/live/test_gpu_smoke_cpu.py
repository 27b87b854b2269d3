"""benchmarks/gpu_smoke.sh --cpu: the GPU smoke script's CPU half, run as CI runs it (the
cached CPU llama-server, the small model made on the spot, two length-ladder cells at N 4:
default flags and -ub 1), each leaving a cert that verifies; about a minute on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from batch_invariance.provision.embedded import Provisioned
from tests.support.paths import REPO


def test_the_cpu_half_leaves_verified_certs(live_pair: Provisioned, tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "CARRY": str(tmp_path)}
    run = subprocess.run(
        [str(REPO / "benchmarks" / "gpu_smoke.sh"), "--cpu"],
        capture_output=True, text=True, env=env, timeout=170, check=False,
    )  # fmt: skip
    summary = (out / "summary.txt").read_text()
    assert run.returncode == 0, summary + run.stderr[-2000:]
    certs = sorted(out.glob("cells/*/*.json"))
    assert [c.parent.name for c in certs] == ["default-N4", "ub1-N4"], summary
    for cert in certs:
        data = json.loads(cert.read_text())
        assert data["verdict"] in ("GREEN", "RED", "AMBER"), data["verdict"]
        assert f"{cert.parent.name}: {data['verdict']}" in summary
    ub1 = json.loads(certs[1].read_text())
    assert '"-ub", "1"' in json.dumps(ub1["provenance"])
    assert json.loads((out / "server.provenance.json").read_text())["sha256"] == (
        live_pair.server_sha256
    )
