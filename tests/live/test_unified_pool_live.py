"""A unified KV pool measured up to 3/4 of the POOL on the real llama-server (the embedded
Gemma 3 270M pair, CPU): ``run-live --kv-layout unified`` at ctx 512 x N 2 (one pool of 1024
tokens that any slot may fill). The ladder's long rungs reach past 768 tokens, each co-batched
with a short companion while the KV in flight stays within the pool; A runs on one slot of the
whole pool. The verdict may be RED (this pair drifts under co-batching): the point is the
reach, the co-batching of the long rows and that the server was never asked for more KV than
the pool holds (no long row failed). A few minutes on 2 cores."""

from __future__ import annotations

from pathlib import Path

from batch_invariance.cli import build_parser
from batch_invariance.commands.cell_options import request_from_args
from batch_invariance.core.evidence import DEFAULT_OVERLAP_MARGIN_S, TRANSPORT_MODES
from batch_invariance.core.scope import required_length
from batch_invariance.provision.embedded import Provisioned
from batch_invariance.service.live import prepare, run_live_cell

CTX, N = 512, 2
POOL = CTX * N
#: Short answers keep the run small, and leave the pool room for 3/4 of it beside a companion.
CELL = f"--ctx {CTX} --parallel {N} --kv-layout unified --n-predict 32 --gate-passes 2 --reps 1"


def _argv_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_a_unified_pool_is_measured_to_three_quarters_of_it_co_batched(
    live_pair: Provisioned, tmp_path: Path
) -> None:
    argv = ["run-live", "--server-bin", str(live_pair.server_bin), "--model",
            str(live_pair.model), "--out-dir", str(tmp_path / "out"), *CELL.split()]  # fmt: skip
    outcome = run_live_cell(prepare(request_from_args(build_parser().parse_args(argv))))
    cert = outcome.finished.cert
    assert cert.source == "live" and cert.ctx == CTX and "unified" in cert.kv_label
    # The servers: A on one slot of the whole pool, B/C on N slots sharing it (-kvu).
    servers = {s["role"]: s["argv"] for s in cert.provenance.record()["servers"]}
    assert _argv_value(servers["A"], "--ctx-size") == str(POOL)
    assert _argv_value(servers["A"], "--parallel") == "1"
    assert _argv_value(servers["BC"], "--ctx-size") == str(POOL)
    assert "--kv-unified" in servers["BC"] and _argv_value(servers["BC"], "--parallel") == str(N)
    # The cert's reached length is past 3/4 of the pool (what a `-kvu -c 1024 -np 2` deploy
    # needs), not only of the 512-token slot.
    scope = cert.sequence_scope
    assert scope is not None and scope.longest is not None
    assert scope.longest >= required_length(POOL), scope.statement
    evidence = cert.evidence
    pool_ids = {i.test_id for i in outcome.workset.items if i.family == "pool"}
    assert len(pool_ids) == 4
    for p in evidence.c_passes:
        # The witness: the server itself saw two requests busy at once in the pass.
        assert p.server_busy_max is not None and p.server_busy_max >= 2, p.index
        long_rows = []
        for test_id in pool_ids:
            c, a = p.trials[test_id], evidence.a[test_id]
            # Never more KV asked than the pool holds: every long row was answered.
            assert c.failure_mode not in TRANSPORT_MODES, (test_id, c)
            assert a.failure_mode not in TRANSPORT_MODES, (test_id, a)
            assert c.prompt_tokens_measured is not None and a.completion_tokens is not None
            assert c.completion_tokens is not None
            length = c.prompt_tokens_measured + min(a.completion_tokens, c.completion_tokens)
            if length >= required_length(POOL):
                long_rows.append(test_id)
        assert long_rows, f"pass {p.index}: no row reached 3/4 of the pool"
        for test_id in long_rows:
            mine = p.trials[test_id]
            assert mine.dispatch_ts is not None and mine.complete_ts is not None
            # Co-batched: another request of the pass overlapped it by the gate's margin.
            assert any(
                min(mine.complete_ts, other.complete_ts) - max(mine.dispatch_ts, other.dispatch_ts)
                >= DEFAULT_OVERLAP_MARGIN_S
                for k, other in p.trials.items()
                if k != test_id and other.dispatch_ts is not None and other.complete_ts is not None
            ), (p.index, test_id)
