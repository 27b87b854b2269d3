"""vLLM (the CPU build) sized by the memory guard and measured with prefix caching on: the
tool's reading of the memory node against vLLM's own, and a small cache-arm cell on the real
server whose every launch carries the sized ``--gpu-memory-utilization`` and whose reuse comes
from vLLM's own counts (``usage.prompt_tokens_details.cached_tokens`` per response, the
prefix-cache counters on ``/metrics``)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from batch_invariance.cert.verify import verify_path
from batch_invariance.cli import build_parser
from batch_invariance.commands.cell_options import request_from_args
from batch_invariance.host.node_memory import read_node_memory
from batch_invariance.provision.vllm import VllmProvisioned
from batch_invariance.run.workset import bundled_workset_path
from batch_invariance.service.job import prepare
from batch_invariance.service.live import run_live_cell

pytestmark = pytest.mark.live

VLLM_NODE = (
    "from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info\n"
    "m = get_memory_node_info(get_allowed_cpu_list()[0].numa_node)\n"
    "import psutil\n"
    "print(m.total_memory, m.available_memory, psutil.Process().memory_info().rss)\n"
)
#: 8 conversation turns, N 2, 16 tokens, one pass: the point is the start and the reuse.
CELL = (
    "--ctx 1024 --parallel 2 --gate-passes 1 --reps 1 --n-predict 16 --no-serial-repeat "
    "--endpoint completions --cache-arm --ready-timeout 900 --req-timeout 600 "
    "--server-flag=--dtype --server-flag=float32 --server-flag=--enforce-eager"
)


def test_the_node_reader_agrees_with_vllms_own(vllm: VllmProvisioned) -> None:
    before = read_node_memory()
    out = subprocess.run(
        [str(vllm.venv.python), "-c", VLLM_NODE], capture_output=True, text=True, timeout=300
    )
    after = read_node_memory()
    assert out.returncode == 0, out.stderr[-2000:]
    total, available, own_rss = (int(x) for x in out.stdout.split()[-3:])
    assert before.total_bytes == after.total_bytes == total
    # Free memory moves while vLLM imports (seconds), and vLLM reads with its own imports
    # resident: its reading must lie between ours, taken just before and just after, less
    # its own resident set, give or take 64 MiB.
    low = min(before.available_bytes, after.available_bytes) - own_rss - 64 * 1024**2
    high = max(before.available_bytes, after.available_bytes) + 64 * 1024**2
    assert low <= available <= high, (before, available, after)


@pytest.mark.slow
def test_vllm_cache_arm_starts_with_the_sized_fraction_and_proves_reuse(
    vllm: VllmProvisioned, tmp_path: Path
) -> None:
    rows = json.loads(Path(bundled_workset_path("cache_conversations")).read_text())
    workset = tmp_path / "cache8.json"
    workset.write_text(json.dumps(rows[:8]))
    args = build_parser().parse_args([
        "run-live", "--engine", "vllm", "--server-bin", str(vllm.venv.python),
        "--model", str(vllm.model_dir), "--workset", str(workset),
        "--out-dir", str(tmp_path / "out"), *CELL.split(),
    ])  # fmt: skip
    started = time.monotonic()
    finished = run_live_cell(prepare(request_from_args(args))).finished
    wall = time.monotonic() - started
    cert = finished.cert
    record = cert.provenance.record()
    launches = record["memory_guard"]["launches"]
    servers = record["servers"]
    # Every server started, each with the fraction the guard sized, recorded beside it.
    assert [s["role"] for s in servers] == [launch["arm"] for launch in launches]
    for server, launch in zip(servers, launches, strict=True):
        argv = server["argv"]
        assert argv[argv.index("--gpu-memory-utilization") + 1] == f"{launch['memory_fraction']:g}"
        assert 0 < launch["memory_fraction"] < 0.92
    cache_server = next(s for s in servers if s["role"] == "cache")
    assert "--enable-prefix-caching" in cache_server["argv"]
    block = cert.prompt_cache
    assert block is not None
    evidence = cache_server["info"]["cache_evidence"]
    print(
        f"\nvLLM cache arm: wall {wall:.0f} s; fractions "
        f"{[launch['memory_fraction'] for launch in launches]}; ready "
        f"{[launch['ready_s'] for launch in launches]} s; reuse ok={block.reuse.ok} "
        f"tokens={block.reuse.tokens_reused} unreported={block.reuse.n_unreported}; "
        f"counters {evidence['counters']}; status {block.status}; verdict {cert.verdict} "
        f"({cert.divergence_class}); reasons {list(cert.decision_reasons)}"
    )
    # vLLM's own counts: every response said how much it reused, and some turns did.
    assert block.reuse.n_unreported == 0 and block.reuse.tokens_reused > 0
    assert block.reuse.ok, block.reuse.reason
    assert evidence["hits_seen"] is True
    # The cold arms stayed cold (prefix caching off there).
    assert cert.gates["prompt_cache"].ok, cert.gates["prompt_cache"].reason
    # A model folder has no recorded digest yet, so the cert never verifies (fail closed);
    # nothing else may be wrong with it.
    problems = verify_path(finished.path).problems
    assert len(problems) == 1 and "no sha256 of the model file is recorded" in problems[0]
