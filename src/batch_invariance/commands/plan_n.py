"""`batch-invariance plan-n`: projected memory for n = 1..N slots, launching nothing."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.core.plan import CellSize, number_problems
from batch_invariance.errors import UsageError
from batch_invariance.host import memory
from batch_invariance.host.gguf import parse_info
from batch_invariance.service.options import LaunchOptions


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "plan-n",
        help="project memory (weights + KV) for each n in 1..N; launches nothing",
        description=(
            "For each n in 1..N, print the projected footprint of a --parallel n server with "
            "ctx tokens per slot (weights from the file size, KV cache from the GGUF header) "
            "against --max-footprint-gb and what is available now: free VRAM (nvidia-smi) for "
            "the part -ngl puts on the GPU, host memory otherwise."
        ),
    )
    p.add_argument("--model", type=Path, required=True, help="GGUF model file")
    p.add_argument("--ctx", type=int, required=True, help="context tokens per slot")
    p.add_argument("--parallel", type=int, required=True, help="largest N to plan for")
    p.add_argument("--max-footprint-gb", type=float, default=None, help="memory cap in GiB")
    p.add_argument(
        "--server-flag",
        action="append",
        default=[],
        help="server flag as it would be passed (cache types -ctk/-ctv and -ngl are honoured)",
    )
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    launch = LaunchOptions(max_footprint_gb=args.max_footprint_gb)
    problems = number_problems(CellSize(ctx=args.ctx)) + number_problems(launch)
    if problems:
        raise UsageError(problems[0])
    if args.parallel < 1:  # the largest N to list: 1 is a plan too
        raise UsageError(f"--parallel must be at least 1 (got {args.parallel})")
    info = parse_info(args.model)
    host = memory.read_host_memory()
    gpu = memory.offloads_to_gpu(args.server_flag)
    avail = host.vram_free_bytes if gpu else host.mem_available_bytes
    where = "VRAM free" if gpu else "available"
    cap = "none" if args.max_footprint_gb is None else f"{args.max_footprint_gb:g} GiB"
    avail_s = "unknown" if avail is None else f"{avail / memory.GIB:.2f} GiB"
    print(
        f"model {args.model.name}: {info.architecture}, {info.block_count} layers, "
        f"MoE={'yes' if info.is_moe else 'no'}; ctx {args.ctx}/slot; cap {cap}; "
        f"{where} {avail_s}"
    )
    gpu_col = f"  {'on GPU':>9}" if gpu else ""
    print(f"{'n':>3}  {'weights':>9}  {'kv':>9}  {'overhead':>9}  {'total':>9}{gpu_col}  fits")
    refusals: list[str] = []
    for n in range(1, args.parallel + 1):
        proj = memory.project(info, args.ctx, n, args.server_flag)
        decision = memory.evaluate(proj, host, args.max_footprint_gb, gpu)
        g = memory.GIB
        on_gpu = f"  {proj.vram_bytes / g:>7.2f}Gi" if gpu else ""
        print(
            f"{n:>3}  {proj.weights_bytes / g:>7.2f}Gi  {proj.kv_bytes / g:>7.2f}Gi  "
            f"{proj.overhead_bytes / g:>7.2f}Gi  {proj.total_gib:>7.2f}Gi{on_gpu}  "
            f"{'yes' if decision.refusal is None else 'NO'}"
        )
        if decision.refusal is not None:
            refusals.append(decision.refusal)
    if refusals:  # the first n that does not fit, with its fix
        print(refusals[0].replace("memory guard: ", "first that does not fit: ", 1))
    return exitcodes.PROMOTABLE
