"""The search: one (model, ctx, N) cell over the engine's declared space of options.

Each configuration (:attr:`~batch_invariance.engines.base.Engine.search_space`) is its own live
cell, prepared and run exactly as ``run-live`` runs one (:func:`~batch_invariance.service.live.
prepare`, :func:`~batch_invariance.service.live.run_live_cell`): the same driver, core and cert
writer, one folder of certs per configuration. Cheap first: a probe (the same cell over a few
prompts that cross the engine's drift boundary and reach the slot's end, two C passes) can
only reject (:mod:`batch_invariance.core.search`); a full cert, the whole ladder and every
gate, is measured only where the probe did not reject. The defaults always get their full
cert: they are the positive control and what every other throughput is set against. A cert
already in the configuration's folder for the same identity (binary and model sha256, server
flags and KV layout, ctx and N, rules version) is reused, not measured again.
``budget_s`` is checked before every step with that step's estimate: the search stops with
what it measured, and a cert is only ever written whole (atomically, by the cert store). Last,
each promotable GREEN is set against the defaults in interleaved rounds (``search_interleave``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from batch_invariance.cert.store import atomic_write_text, cert_path
from batch_invariance.cert.verify import Depth, Verification, verify
from batch_invariance.core.plan import eta_seconds
from batch_invariance.core.rules import RULES_VERSION
from batch_invariance.core.search import (
    Measured,
    SearchRow,
    probe_ids,
    probe_per_boundary,
    probe_rejects,
)
from batch_invariance.engines.registry import engine_for
from batch_invariance.engines.search_space import SearchConfig
from batch_invariance.errors import GuardRefused, InfraError, UsageError
from batch_invariance.profiles.ladder import LADDER_PROMPTS
from batch_invariance.run.progress import ProgressSink
from batch_invariance.run.workset import Workset, items_to_row, workset_from_items
from batch_invariance.service.dry_run import usable_cpus
from batch_invariance.service.live import LiveCell, prepare, run_live_cell
from batch_invariance.service.request import LiveRequest
from batch_invariance.service.search_interleave import (
    PROBE_WORKSET,
    InterleaveRun,
    Point,
    StepClock,
    figure_reused,
    interleave_greens,
    interleave_plan,
)
from batch_invariance.service.search_record import deploy_argv, previous_interleaved, search_record
from batch_invariance.service.target import (
    LauncherFactory,
    TargetIdentity,
    engine_launcher,
    identify,
)

__all__ = ["SEARCH_FILE", "SearchJob", "SearchOutcome", "SearchRequest", "plan_lines",
           "prepare_search", "reusable", "run_search"]  # fmt: skip

SEARCH_FILE = "search.json"
PROBES = "probes"  # the probes' certs, a sub-folder per configuration
#: C passes of a probe: enough to see co-batched drift, not to certify anything.
PROBE_PASSES = 2


@dataclass(frozen=True)
class SearchRequest:
    """The cell (its flags are the base every configuration adds to) and what to walk."""

    cell: LiveRequest
    #: Configuration names to walk (``None``: the engine's whole space); the defaults always.
    only: tuple[str, ...] | None = None
    budget_s: float | None = None
    #: Interleaved rounds of each promotable GREEN against the defaults (0: none).
    interleave_rounds: int = 3


@dataclass(frozen=True)
class SearchJob:
    points: tuple[Point, ...]
    out_dir: Path
    budget_s: float | None
    #: The engine's drift boundaries the probe crosses (tokens).
    boundaries: tuple[int, ...]
    interleave_rounds: int = 3

    def step_eta(self, cell: LiveCell, n_items: int) -> float | None:
        gguf = cell.target.gguf
        if gguf is None:
            return None
        m = cell.measurement
        return eta_seconds(gguf.file_size, n_items * m.reps, n_predict=m.n_predict,
                           gate_passes=m.gate_passes, serial_repeat=m.serial_repeat,
                           cpus=usable_cpus())  # fmt: skip


@dataclass(frozen=True)
class SearchOutcome:
    rows: tuple[SearchRow, ...]
    record: dict[str, Any]
    path: Path
    stopped: str | None


def _space(engine_name: str, only: tuple[str, ...] | None) -> tuple[SearchConfig, ...]:
    space = engine_for(engine_name).search_space
    if only is None:
        return space
    names = {c.name for c in space}
    unknown = [n for n in only if n not in names]
    if unknown:
        raise UsageError(
            f"--configs {','.join(unknown)}: not in {engine_name}'s space; choose from "
            + ", ".join(sorted(names))
        )
    return tuple(c for c in space if c.is_defaults or c.name in only)


def _probe_workset(workset: Workset, boundaries: tuple[int, ...], per: int) -> Workset:
    """The probe's prompts out of the cell's own work-set (ranked by the ladder's sequence
    targets, else by prompt length): ``per`` past each boundary and at the slot's end."""
    seqs = [(i.test_id, int(i.meta.get("sequence_target") or len(i.prompt or "") // 4))
            for i in workset.items]  # fmt: skip
    keep = set(probe_ids(seqs, boundaries, per))
    items = [i for i in workset.items if i.test_id in keep]
    return workset_from_items(
        items, f"search probe of {workset.record().get('source', 'the cell')}"
    )


def _probe_cell(full: LiveCell, out_dir: Path, boundaries: tuple[int, ...]) -> LiveCell:
    m = replace(full.measurement, gate_passes=PROBE_PASSES, reps=1, stop_on_red=True)
    per = probe_per_boundary(full.parallel, len(boundaries))
    builder = full.build_workset
    build = None
    if builder is not None:

        def build(ctx: int, counter: Callable[[str], int]) -> Workset:
            return _probe_workset(builder(ctx, counter), boundaries, per)

    workset = None if full.workset is None else _probe_workset(full.workset, boundaries, per)
    return replace(full, measurement=m, out_dir=out_dir, build_workset=build, workset=workset)


def prepare_search(request: SearchRequest, *, create_out_dir: bool = True) -> SearchJob:
    """Check every configuration's cell once (UsageError naming the first problem)."""
    base = request.cell
    if base.attach.base_url is not None:
        raise UsageError("search cannot take --base-url: it launches one server per configuration")
    if base.out_dir is None:
        raise UsageError("--out-dir DIR is required (one folder of certs per configuration)")
    if request.budget_s is not None and request.budget_s <= 0:
        raise UsageError(f"--budget {request.budget_s:g}: give a positive number of seconds")
    if request.interleave_rounds < 0:
        raise UsageError(f"--interleave-rounds {request.interleave_rounds}: give 0 or more")
    engine = engine_for(base.engine)
    boundaries = (engine.kv_view_pad,) if engine.kv_view_pad else ()
    points = []
    for config in _space(base.engine, request.only):
        folder = base.out_dir / config.slug
        asked = replace(base, server_flags=(*base.server_flags, *config.flags),
                        launch=replace(base.launch, kv_layout=config.kv_layout),
                        out_dir=folder, driver_name="search")  # fmt: skip
        try:
            full = prepare(asked, create_out_dir=create_out_dir)
        except UsageError as exc:  # a unified pool too small for its ladder's long rungs
            if config.kv_layout == "split":
                raise
            raise UsageError(f"configuration {config.name}: {exc} (or pick --configs)") from None
        # Probe certs (never promotable) stay out of the folder ``serve --certs`` reads.
        probes = base.out_dir / PROBES / config.slug
        points.append(Point(config, full, _probe_cell(full, probes, boundaries)))
    return SearchJob(tuple(points), base.out_dir, request.budget_s, boundaries,
                     request.interleave_rounds)  # fmt: skip


def _measured(v: Verification, reused: bool) -> Measured:
    cert = v.cert
    scope = None if cert is None else cert.sequence_scope
    tp = None if cert is None else cert.throughput
    return Measured(
        path=str(v.path), valid=v.valid, verdict=v.verdict, promotable=v.promotable,
        slot_ctx=None if scope is None else scope.slot_ctx,
        longest=None if scope is None else scope.longest,
        first_drift_position=None if scope is None else scope.first_drift_position,
        bitwise_equal_up_to=None if scope is None else scope.bitwise_equal_up_to,
        speedup=None if tp is None else tp.speedup,
        concurrent_tokens_per_s=None if tp is None else tp.concurrent_tokens_per_s,
        reused=reused,
    )  # fmt: skip


def reusable(cell: LiveCell, identity: TargetIdentity) -> Measured | None:
    """The cert already in ``cell``'s folder for this very cell, where it verifies: same
    binary (its libraries too) and model sha256, server flags, KV layout, ctx, N and rules."""
    path = cert_path(cell.out_dir, cell.model_name, cell.ctx, cell.parallel)
    if not path.is_file():
        return None
    v = verify(path, Depth.FULL)
    cert = v.cert
    if cert is None or not v.valid or cert.rules_version != RULES_VERSION:
        return None
    prov = cert.provenance
    binary = prov.server_binary
    model = prov.model_file
    label = cell.target.engine.kv_label(cell.ctx, cell.parallel, cell.launch.kv_layout)
    same = (
        binary is not None and identity.binary is not None
        and binary.sha256 == identity.binary.sha256
        and (binary.library_sha256() or {}) == (identity.binary.record().library_sha256() or {})
        and model is not None and model.sha256 == identity.model_sha256
        and tuple(prov.server_flags or ()) == tuple(cell.server_flags)
        and cert.kv_label == label and cert.ctx == cell.ctx and cert.dispatch_n == cell.parallel
    )  # fmt: skip
    return _measured(v, reused=True) if same else None


def engine_launchers(config: SearchConfig) -> LauncherFactory:
    """The launcher of a configuration's servers: the engine's, with the configuration's
    variables over this process's (vLLM's batch-invariant mode is one)."""
    return partial(engine_launcher, extra_env=dict(config.env))


def _measure(
    cell: LiveCell, factory: LauncherFactory, sink: ProgressSink | None, *, keep_workset: bool
) -> Measured:
    """One cell through run-live's own service, read back from the cert it wrote."""
    outcome = run_live_cell(cell, sink, launcher_for=factory)
    if keep_workset:
        rows = [items_to_row(i) for i in outcome.workset.items]
        atomic_write_text(cell.out_dir / PROBE_WORKSET, json.dumps(rows, indent=1) + "\n")
    return _measured(verify(outcome.finished.path, Depth.FULL), reused=False)


def run_search(
    job: SearchJob,
    *,
    now: Callable[[], float] = time.monotonic,
    launchers: Callable[[SearchConfig], LauncherFactory] = engine_launchers,
    progress: Callable[[], ProgressSink] | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> SearchOutcome:
    """Probe every configuration, then certify every one the probe did not reject (the
    defaults whatever their probe said); write ``search.json`` after every step.
    ``launchers`` gives each configuration's launcher factory (a test passes the mock's);
    ``progress`` a fresh progress sink per cell; ``say`` hears one line per step."""
    identity = identify(job.points[0].full.target)
    clock = StepClock(now, job.budget_s)
    previous = previous_interleaved(job.out_dir / SEARCH_FILE)  # read before the first write
    rows = {p.config.name: _row(p) for p in job.points}
    stopped: str | None = None

    def step(point: Point, kind: str) -> None:
        nonlocal stopped
        cell = point.probe if kind == "probe" else point.full
        found = reusable(cell, identity)
        if found is None:
            n_items = _probe_items(job) if kind == "probe" else LADDER_ETA_ITEMS
            if stopped or not clock.fits(kind, job.step_eta(cell, n_items)):
                stopped = stopped or clock.reached()
                return
            began = clock.now()
            say(f"search: {kind} of {point.config.name} ({point.config.words()})")
            sink = None if progress is None else progress()
            try:
                found = _measure(cell, launchers(point.config), sink, keep_workset=kind == "probe")
            except (InfraError, GuardRefused) as exc:
                # One configuration the server cannot start (or run) ends its row, not the
                # search; an interrupt still ends everything.
                row = rows[point.config.name]
                rows[point.config.name] = replace(row, not_run=f"{kind} failed: {exc}")
                _write(job, rows, stopped, clock)
                return
            clock.took.setdefault(kind, []).append(clock.now() - began)
        name = point.config.name
        if kind == "cert":
            deploy = deploy_argv(Path(found.path))
            rows[name] = replace(rows[name], cert=found, not_run=None, deploy=deploy)
        else:
            rows[name] = replace(rows[name], probe=found, not_run=None)
        _write(job, rows, stopped, clock)

    for point in job.points:
        step(point, "probe")
    for point in job.points:
        row = rows[point.config.name]
        if point.config.is_defaults or (row.probe is not None and not probe_rejects(row.probe)):
            step(point, "cert")
    if not stopped:
        run = InterleaveRun(job.interleave_rounds, job.out_dir, clock, launchers, previous, say,
                            lambda now: _write(job, now, stopped, clock))  # fmt: skip
        stopped = interleave_greens(job.points, rows, run)
    final = {n: _not_run(r, stopped) for n, r in rows.items()}
    path = _write(job, final, stopped, clock)
    return SearchOutcome(tuple(final.values()), json.loads(path.read_text()), path, stopped)


LADDER_ETA_ITEMS = LADDER_PROMPTS


def _probe_items(job: SearchJob) -> int:
    """Prompts a probe sends at most; a full cert's estimate counts the ladder's."""
    n = len(job.boundaries) + 1
    return n * probe_per_boundary(job.points[0].full.parallel, n - 1)


def _minutes(seconds: float) -> str:
    return f"~{seconds / 60:.0f} min"


def _boundaries(job: SearchJob) -> str:
    known = ", ".join(f"{b} tokens" for b in job.boundaries)
    return known or "no boundary known for this engine"


def plan_lines(job: SearchJob) -> list[str]:
    """What the search will do and how long it may take (``--dry-run``; launches nothing).
    The ETA is the rough per-cell estimate ``run-live --dry-run`` prints
    (:func:`~batch_invariance.core.plan.eta_seconds`), per step."""
    first = job.points[0].full
    identity = identify(first.target)
    lines = [
        f"search plan: {first.model_name} ctx={first.ctx} N={first.parallel} engine "
        f"{first.target.engine.name}: {len(job.points)} configuration(s) (nothing launched)",
        f"probe: up to {_probe_items(job)} prompts, past {_boundaries(job)} and at the slot's end, "
        f"{PROBE_PASSES} C passes; it can only reject",
    ]
    il_line, il_eta = interleave_plan(job.points, job.interleave_rounds)
    lines.append(il_line)
    previous = previous_interleaved(job.out_dir / SEARCH_FILE)
    least = most = 0.0
    known = il_eta is not None
    for p in job.points:
        probe_eta = job.step_eta(p.probe, _probe_items(job))
        cert_eta = job.step_eta(p.full, LADDER_ETA_ITEMS)
        reused = [k for k, c in (("probe", p.probe), ("cert", p.full)) if reusable(c, identity)]
        if probe_eta is None or cert_eta is None:
            known = False
        else:
            least += 0 if "probe" in reused else probe_eta
            most += (0 if "probe" in reused else probe_eta) + (0 if "cert" in reused else cert_eta)
            if p.config.is_defaults:
                least += 0 if "cert" in reused else cert_eta
        if not p.config.is_defaults and job.interleave_rounds:
            if figure_reused(job.points, p, previous.get(p.config.name), job.interleave_rounds):
                reused.append("interleaved figure")
            else:
                most += il_eta or 0.0
        then = "probe, then cert (positive control)"
        if not p.config.is_defaults:
            then = "probe, cert unless rejected" + (", then interleaved if promotable GREEN"
                                                    if job.interleave_rounds else "")  # fmt: skip
        note = f"; reuses its {' and '.join(reused)}" if reused else ""
        lines.append(f"  {p.config.name}: {p.config.words()}: {then}{note}")
    eta = (
        f"{_minutes(least)} if every probe rejects, {_minutes(most)} if none does"
        if known
        else "unknown"
    )
    lines.append(f"ETA: {eta} (rough: from model size and CPU count)")
    budget = "none" if job.budget_s is None else f"{job.budget_s:g} s"
    lines.append(f"budget: {budget}; out-dir: {job.out_dir} (one folder per configuration)")
    return lines


def _row(point: Point) -> SearchRow:
    c = point.config
    return SearchRow(c.name, c.words(), c.is_defaults, not_run="not reached",
                     certs=str(point.full.out_dir))  # fmt: skip


def _not_run(row: SearchRow, stopped: str | None) -> SearchRow:
    """Why a row has no full cert, where the budget is the reason (a failure keeps its own)."""
    if row.not_run is not None and "failed" in row.not_run:
        return row
    if row.probe is None and row.cert is None:
        return replace(row, not_run=stopped or "not reached")
    if row.cert is None and row.probe is not None and not probe_rejects(row.probe) and stopped:
        return replace(row, not_run=stopped)
    return row


def _write(
    job: SearchJob, rows: dict[str, SearchRow], stopped: str | None, clock: StepClock
) -> Path:
    first = job.points[0].full
    record = search_record(first.model_name, first.ctx, first.parallel,
                           first.target.engine.name, list(rows.values()), stopped=stopped,
                           wall_s=round(clock.elapsed(), 1))  # fmt: skip
    path = job.out_dir / SEARCH_FILE
    atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path
