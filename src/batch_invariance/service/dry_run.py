"""``--dry-run``: the plan of a live cell (each server's argv, memory, requests, ETA) as text;
nothing is launched. Any launched engine: each argv is the launcher's own
(:meth:`~batch_invariance.servers.launch.EngineLauncher.planned`); an attached server has
nothing to plan."""

from __future__ import annotations

import os
from dataclasses import dataclass

from batch_invariance.core.memory_fraction import FractionDecision
from batch_invariance.core.plan import eta_seconds, prompt_text, serial_arm_count
from batch_invariance.core.power import power_words
from batch_invariance.core.roles import ServerRole
from batch_invariance.core.scope import required_length
from batch_invariance.engines.registry import shown_name
from batch_invariance.errors import UsageError
from batch_invariance.host import memory
from batch_invariance.run.workset import Workset
from batch_invariance.service.live import LiveCell
from batch_invariance.service.reach import planned_workset
from batch_invariance.service.target import engine_launcher

__all__ = ["DryRun", "dry_run", "is_ladder", "ladder_line", "reservation_line", "usable_cpus"]


@dataclass(frozen=True)
class DryRun:
    """The plan as text, and the memory guard's refusal when it would refuse to launch."""

    text: str
    refusal: str | None


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the platform says)."""
    affinity = getattr(os, "sched_getaffinity", None)
    count = len(affinity(0)) if affinity is not None else os.cpu_count()
    return count or 2


def _gib(n: int) -> str:
    return f"{n / memory.GIB:.2f} GiB"


def reservation_line(fraction: FractionDecision, host: memory.HostMemory) -> str:
    """What the server reserves of its memory node: the fraction, whose it is, and the room."""
    node = host.node
    where = "the memory node" if node is None or node.node is None else f"node {node.node}"
    whose = (
        f"given by --server-flag; the tool would size {fraction.sized:g}"
        if fraction.given
        else "sized by the tool"
    )
    return (
        f"reserves: {fraction.fraction:g} of {where} ({whose}) = "
        f"{_gib(fraction.reserved_bytes)} of {_gib(fraction.total_bytes)}; "
        f"{_gib(fraction.available_bytes)} available there"
    )


def is_ladder(workset: Workset) -> bool:
    """The work-set is the length ladder (every item carries its mark)."""
    return bool(workset.items) and all(item.meta.get("ladder") is True for item in workset.items)


def ladder_line(workset: Workset, ctx: int) -> str:
    """What the length ladder covers: prompts, sequence targets per quarter band, and a
    unified pool's long rungs."""
    per_band: dict[str, int] = {}
    slot = [i for i in workset.items if i.family != "pool"]
    for item in slot:
        per_band[item.family or "?"] = per_band.get(item.family or "?", 0) + 1
    targets = [int(i.meta["sequence_target"]) for i in slot]
    bands = ", ".join(f"{name} {count}" for name, count in sorted(per_band.items()))
    line = (
        f"work-set: length ladder, {len(workset.items)} distinct prompts; sequences (prompt + "
        f"answer budget) targeted at {min(targets)}-{max(targets)} of the slot's {ctx} tokens "
        f"(quarter bands: {bands}); a GREEN needs measured sequences >= "
        f"{required_length(ctx)} (3/4 of the slot)"
    )
    rungs = [i for i in workset.items if i.family == "pool"]
    if not rungs:
        return line
    pool = int(rungs[0].meta["pool"])
    at = sorted(int(i.meta["sequence_target"]) for i in rungs)
    prompt = sum(int(i.meta["target_tokens"]) for i in rungs)
    return (
        f"{line}\nunified pool: {len(rungs)} long prompts targeted at {at[0]}-{at[-1]} of "
        f"the pool's {pool} tokens, each sent just before a short companion and never more "
        f"KV in flight than the pool holds (a -kvu deploy needs >= {required_length(pool)}, "
        f"3/4 of the pool); A runs on a one-slot server of the whole pool; they add ~{prompt} "
        "prompt tokens to every arm and pass (the ETA counts their requests, not their prompts)"
    )


def _request_lines(cell: LiveCell, workset: Workset, cpus: int) -> list[str]:
    """What the planned work-set sends: the ladder, the requests, the power, the ETA."""
    m, target = cell.measurement, cell.target
    lines: list[str] = []
    if is_ladder(workset):
        lines.append(ladder_line(workset, cell.ctx))
    n_items = len(workset.items) * m.reps
    # An upper bound: A' runs only when B differs from A, B only on the divergent ids of
    # a RED cell, and --stop-on-red may end the C passes early.
    arms = "A, B, A' if B differs" if m.serial_repeat else "A, B"
    total = n_items * (serial_arm_count(m.serial_repeat) + m.gate_passes + m.cache_passes)
    plural = "es" if m.cache_passes > 1 else ""
    cache = f" + {m.cache_passes} prompt-cache pass{plural}" if m.cache_passes else ""
    lines.append(
        f"requests: up to {total} = {n_items} items x ({arms} + {m.gate_passes} C passes "
        f"of {cell.parallel} workers{cache}); endpoint {m.endpoint}; n_predict {m.n_predict}"
    )
    # The most the schedule can say (every C request co-batched): docs/power.md.
    distinct = len({prompt_text(item) for item in workset.items})
    lines.append(f"power at most: {power_words(distinct, n_items * m.gate_passes)}")
    if target.gguf is None:
        lines.append("ETA: unknown (no GGUF model size to estimate from)")
        return lines
    eta = eta_seconds(
        target.gguf.file_size,
        n_items,
        n_predict=m.n_predict,
        gate_passes=m.gate_passes,
        serial_repeat=m.serial_repeat,
        cpus=cpus,
    )
    lines.append(f"ETA: ~{eta / 60:.1f} min (rough: from model size and CPU count)")
    return lines


def dry_run(cell: LiveCell, host: memory.HostMemory, cpus: int) -> DryRun:
    """The plan of ``cell`` on a host with ``host`` memory and ``cpus`` CPUs."""
    target = cell.target
    if target.attach is not None:
        raise UsageError(
            "--dry-run is not available with --base-url: the tool launches nothing to plan there"
        )
    port = str(cell.port_policy.fixed) if cell.port_policy.fixed is not None else "<free>"
    launcher = engine_launcher(target, cell.launch, cell.out_dir, cell.port_policy)
    refused: str | None = None
    named = shown_name(target.engine)
    engine = f" engine {named}" if named else ""
    lines = [
        f"dry run:{engine} cell {cell.model_name} ctx={cell.ctx} N={cell.parallel} "
        "(nothing launched)"
    ]
    for arm, n in cell.servers:
        ctx = cell.serial_ctx if arm == ServerRole.A else cell.ctx
        decision = launcher.guard_decision(n, ctx, host, arm)
        planned = launcher.planned(n, ctx, 0, arm, decision)
        argv = planned.command.argv
        shown = [port if a == "0" and i > 0 and argv[i - 1] == "--port" else a
                 for i, a in enumerate(argv)]  # fmt: skip
        lines.append(f"server {arm}: {' '.join(shown)}")
        if decision is None:
            lines.append(f"  memory guard: not applied ({target.gguf_skipped})")
            continue
        proj = decision.projection
        refused = refused or decision.refusal
        cache = f" + prompt cache {_gib(proj.cache_bytes)}" if proj.cache_bytes else ""
        if proj.cache_unbounded:
            cache = " + prompt cache unbounded (--cache-ram -1: the RSS watch bounds it)"
        lines.append(
            f"  kv: {planned.kv_label}; projected {_gib(proj.total_bytes)} "
            f"(weights {_gib(proj.weights_bytes)} + KV {_gib(proj.kv_bytes)} + overhead "
            f"{_gib(proj.overhead_bytes)}{cache}); guard: {decision.refusal or 'ok'}"
        )
        if decision.reservation is not None:
            lines.append(f"  {reservation_line(decision.reservation, host)}")
    avail = host.mem_available_bytes
    cap_gb = cell.launch.max_footprint_gb
    cap = "none" if cap_gb is None else f"{cap_gb:g} GiB"
    lines.append(
        f"memory: cap {cap}; available now {_gib(avail) if avail is not None else 'unknown'}"
        + (f"; VRAM free {_gib(host.vram_free_bytes)}" if host.vram_free_bytes else "")
    )
    # The length ladder is planned with the offline estimate (the run fits it again with the
    # A server's tokenizer, which moves each prompt by a few tokens).
    workset = planned_workset(cell)
    if workset is not None:
        lines.extend(_request_lines(cell, workset, cpus))
    else:
        lines.append("requests: the profile's work-set is built on a calibration server")
    lines += _closing_lines(cell)
    return DryRun(text="\n".join(lines) + "\n", refusal=refused)


def _closing_lines(cell: LiveCell) -> list[str]:
    """What ``--endpoint auto`` chose and why (when it chose), and where the cert goes."""
    chosen = cell.endpoint
    auto = [chosen.line()] if chosen is not None and chosen.why is not None else []
    cert_name = f"{cell.model_name}__ctx{cell.ctx}__N{cell.parallel}.json"
    return [*auto, f"out-dir: {cell.out_dir} (cert {cert_name})"]
