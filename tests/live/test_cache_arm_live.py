"""The prompt-cache arm against the real llama-server on the embedded default: a small
cache-shaped cell (the bundled conversations, short answers) with the cache on, the reuse the
server itself reports, and a cert that verifies and names which traffic it covers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_invariance.cert.verify import verify
from batch_invariance.cli import build_parser
from batch_invariance.commands.cell_options import request_from_args
from batch_invariance.provision.embedded import Provisioned
from batch_invariance.run.workset import bundled_workset_path
from batch_invariance.service.live import prepare, run_live_cell

pytestmark = pytest.mark.live

#: Two passes, 32 tokens: the point is the cache arm and its evidence, not the bound.
CELL = (
    "--ctx 1024 --parallel 4 --gate-passes 2 --reps 1 --n-predict 32 --no-serial-repeat "
    "--endpoint completions --cache-arm"
)


def test_cache_arm_on_the_real_server_proves_reuse_and_names_the_cache(
    live_pair: Provisioned, tmp_path: Path
) -> None:
    workset = tmp_path / "cache12.json"
    rows = json.loads(Path(bundled_workset_path("cache_conversations")).read_text())
    workset.write_text(json.dumps(rows[:12]))
    args = build_parser().parse_args([
        "run-live", "--server-bin", str(live_pair.server_bin), "--model", str(live_pair.model),
        "--workset", str(workset), "--out-dir", str(tmp_path / "out"), *CELL.split(),
    ])  # fmt: skip
    finished = run_live_cell(prepare(request_from_args(args))).finished
    cert = finished.cert
    block = cert.prompt_cache
    assert block is not None
    # The server's own counts: later turns reuse the turn they extend (a first turn, sharing
    # only the preamble, reuses nothing on a sliding-window model with the defaults).
    assert block.reuse.ok, block.reuse.reason
    assert block.reuse.n_unreported == 0 and block.reuse.tokens_reused > 0
    # The cold arms stayed cold (cache_prompt false on a --cache-ram 0 server).
    assert cert.gates["prompt_cache"].ok, cert.gates["prompt_cache"].reason
    servers = {s.role: s.argv for s in cert.provenance.server_entries}
    assert servers["cache"] is not None and "--cache-ram" not in servers["cache"]
    assert servers["BC"] is not None and "--cache-ram" in servers["BC"]
    # Where the cache alone changed something, the verdict says so in its own class.
    if block.status in ("changed", "drift") and cert.divergence_report.ac.clean:
        assert cert.divergence_class in ("prompt_cache", "prompt_cache_drift")
    assert any(r.startswith("prompt-cache arm:") for r in cert.decision_reasons) or (
        block.status == "clean"
    )
    verification = verify(finished.path)
    assert verification.valid, verification.problems
