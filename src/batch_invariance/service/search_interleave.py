"""What a promotable GREEN buys against the engine's defaults, interleaved (issue 43).

The table's cert-vs-cert ratio sets two certs against each other that were measured one after
the other, minutes apart: a host that slowed down in between invents a difference. After the
full certs, each promotable GREEN is measured again beside the defaults, in rounds. A round
starts one server at a time (the configuration's, then the defaults', the order turned every
round: :func:`~batch_invariance.core.search.round_order`) and times one concurrent batch of
N requests on each: the same prompts in the same order, the same request
(:func:`~batch_invariance.run.passes.request_template`), sent by the driver's own concurrent
pass, read as concurrent tokens/s by the cert's own throughput rule
(:func:`~batch_invariance.core.throughput.throughput_of_arms`). The figure is the median of
the rounds' ratios. The prompts are the first N of the defaults' probe (its ``workset.json``:
the cell's own prompts past the drift boundary and at the slot's end).

The search's steps share the budget clock (:class:`StepClock`) kept here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from batch_invariance.cert.store import cert_path
from batch_invariance.core.evidence import ARM_C
from batch_invariance.core.plan import CellPlan, batch_eta_seconds
from batch_invariance.core.roles import ServerRole
from batch_invariance.core.search import (
    Interleaved,
    Round,
    SearchRow,
    promotable_green,
    round_order,
)
from batch_invariance.core.throughput import throughput_of_arms
from batch_invariance.engines.search_space import SearchConfig
from batch_invariance.errors import GuardRefused, InfraError, UsageError
from batch_invariance.host.facts import sha256_file
from batch_invariance.run.dispatch import run_concurrent_pass
from batch_invariance.run.passes import arm_stats, request_template
from batch_invariance.run.workset import load_workset
from batch_invariance.service.dry_run import usable_cpus
from batch_invariance.service.live import LiveCell
from batch_invariance.service.target import LauncherFactory

__all__ = ["INTERLEAVE", "PROBE_WORKSET", "InterleaveRun", "Point", "StepClock", "figure_holds",
           "figure_reused", "interleave_greens", "interleave_key", "interleave_plan"]  # fmt: skip

#: The probe's prompts as sent, beside its cert (benchmarks/search_probe_check.py replays them).
PROBE_WORKSET = "workset.json"
#: The interleaved servers' logs, a sub-folder per configuration (the certs' folders stay clean).
INTERLEAVE = "interleave"


@dataclass(frozen=True)
class Point:
    """One configuration, checked: its full cell and its probe cell."""

    config: SearchConfig
    full: LiveCell
    probe: LiveCell


@dataclass
class StepClock:
    """The search's budget: whether a step fits what is left of it."""

    now: Callable[[], float]
    budget: float | None
    start: float = 0.0
    took: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.start = self.now()

    def fits(self, kind: str, prior: float | None) -> bool:
        """Whether a step of ``kind`` fits what is left of the budget, by the mean of the
        steps of its kind measured so far (the prior estimate before any)."""
        if self.budget is None:
            return True
        seen = self.took.get(kind, [])
        guess = sum(seen) / len(seen) if seen else (prior or 0.0)
        return self.now() - self.start + guess <= self.budget

    def elapsed(self) -> float:
        return self.now() - self.start

    def reached(self) -> str:
        return f"budget {self.budget:g} s reached after {self.elapsed():.0f} s"


def _sha256(path: str | None) -> str:
    if path is None or not Path(path).is_file():
        return "-"
    return sha256_file(Path(path))


def interleave_key(config_cert: str | None, defaults_cert: str | None) -> str:
    """What an interleaved figure compared: both full certs, by their files' sha256. A cert
    measured again is another file, so its figure is measured again too."""
    return f"{_sha256(config_cert)}:{_sha256(defaults_cert)}"


def _batch_plan(defaults: Point) -> CellPlan | None:
    """The batch both sides run: the first N prompts the defaults' probe sent."""
    path = defaults.probe.out_dir / PROBE_WORKSET
    if not path.is_file():
        return None
    try:
        items = load_workset(path).items[: defaults.full.parallel]
    except UsageError:
        return None
    full = defaults.full
    return CellPlan(items=tuple(items), ctx=full.ctx, parallel=full.parallel,
                    measurement=full.measurement)  # fmt: skip


def _batch(
    point: Point, factory: LauncherFactory, plan: CellPlan, index: int, log: Path
) -> float | None:
    """One server of ``point``'s cell up, one concurrent batch of ``plan`` on it, down again:
    its concurrent tokens/s (``None`` where a request failed or no token was reported)."""
    cell = point.full
    log.mkdir(parents=True, exist_ok=True)
    launcher = factory(cell.target, cell.launch, log, cell.port_policy)
    with launcher.launch(ServerRole.BC, plan.parallel, plan.ctx) as server:
        # The pass index is the round's: both sides send the prompts in the same order.
        done = run_concurrent_pass(server, request_template(plan), plan.items, plan.parallel,
                                   index, plan.seed, read_counters=False)  # fmt: skip
    if launcher.aborted is not None:
        raise InfraError(launcher.aborted)
    stats = arm_stats(ARM_C, index, done.wall_s, done.responses)
    block = throughput_of_arms([stats.to_record()])
    return None if stats.n_transport_failures or block is None else block.concurrent_tokens_per_s


@dataclass(frozen=True)
class InterleaveRun:
    """What the interleaved step needs of the search around it."""

    rounds: int
    out_dir: Path
    clock: StepClock
    launchers: Callable[[SearchConfig], LauncherFactory]
    #: The last run's figures by configuration (reused where their key still holds).
    previous: Mapping[str, Interleaved]
    say: Callable[[str], None]
    write: Callable[[dict[str, SearchRow]], object]


def _round_eta(point: Point, n: int) -> float | None:
    gguf = point.full.target.gguf
    if gguf is None:
        return None
    return 2 * batch_eta_seconds(gguf.file_size, n, n_predict=point.full.measurement.n_predict,
                                 cpus=usable_cpus())  # fmt: skip


def _compare(
    point: Point, defaults: Point, plan: CellPlan, key: str, run: InterleaveRun
) -> Interleaved:
    rounds: list[Round] = []
    sides = {True: point, False: defaults}
    for index in range(run.rounds):
        if not run.clock.fits("interleave", _round_eta(point, len(plan.items))):
            return Interleaved(tuple(rounds), run.rounds, key, stopped=run.clock.reached())
        began = run.clock.now()
        run.say(f"search: interleaved round {index + 1}/{run.rounds} of {point.config.name} "
                "and the defaults")  # fmt: skip
        tps: dict[bool, float | None] = {}
        first = round_order(index)
        for mine in (first, not first):  # one server at a time, never two
            side = sides[mine]
            log = run.out_dir / INTERLEAVE / point.config.slug / side.config.slug
            try:
                tps[mine] = _batch(side, run.launchers(side.config), plan, index, log)
            except (InfraError, GuardRefused) as exc:
                why = f"interleave failed: {exc}"
                return Interleaved(tuple(rounds), run.rounds, key, stopped=why)
        rounds.append(Round(first, tps[True], tps[False]))
        run.clock.took.setdefault("interleave", []).append(run.clock.now() - began)
    return Interleaved(tuple(rounds), run.rounds, key)


def figure_holds(before: Interleaved | None, key: str, rounds: int) -> bool:
    """Whether the last run's figure still stands: all its rounds ran, as many as asked now,
    over the same two certs."""
    return before is not None and before.complete and before.planned == rounds and before.key == key


def interleave_greens(
    points: tuple[Point, ...], rows: dict[str, SearchRow], run: InterleaveRun
) -> str | None:
    """Each promotable GREEN's interleaved comparison with the defaults, into ``rows`` (written
    after each); the budget's stop, where it stopped the step."""
    defaults = next((p for p in points if p.config.is_defaults), None)
    greens = [
        p for p in points if not p.config.is_defaults and promotable_green(rows[p.config.name])
    ]
    if run.rounds <= 0 or defaults is None or not greens:
        return None
    plan = _batch_plan(defaults)
    stopped = None
    for point in greens:
        row = rows[point.config.name]
        key = interleave_key(_cert(row), _cert(rows[defaults.config.name]))
        before = run.previous.get(point.config.name)
        if before is not None and figure_holds(before, key, run.rounds):
            found = replace(before, reused=True)
        elif plan is None:
            found = Interleaved(
                (), run.rounds, key, stopped="no prompts: the defaults' probe wrote none"
            )
        else:
            found = _compare(point, defaults, plan, key, run)
            if found.stopped is not None and found.stopped.startswith("budget"):
                stopped = found.stopped
        rows[point.config.name] = replace(row, interleaved=found)
        run.write(rows)
    return stopped


def figure_reused(
    points: tuple[Point, ...], point: Point, before: Interleaved | None, rounds: int
) -> bool:
    """Whether the last run's figure for ``point`` holds for the certs now in their folders
    (the dry run's view: the run reuses it only where both certs are reused too)."""
    defaults = next(p.full for p in points if p.config.is_defaults)
    paths = [str(cert_path(c.out_dir, c.model_name, c.ctx, c.parallel))
             for c in (point.full, defaults)]  # fmt: skip
    return figure_holds(before, interleave_key(*paths), rounds)


def _cert(row: SearchRow) -> str | None:
    return None if row.cert is None else row.cert.path


def interleave_plan(points: tuple[Point, ...], rounds: int) -> tuple[str, float | None]:
    """The dry run's line for the interleaved step, and its estimate per configuration."""
    if rounds <= 0:
        return "interleave: off (--interleave-rounds 0): vs defaults is the two certs' figure", 0.0
    first = points[0]
    n = first.full.parallel
    eta = _round_eta(first, n)
    line = (f"interleave: each promotable GREEN against the defaults, {rounds} round(s) of one "
            f"server at a time, {n} requests each, the order turned every round")  # fmt: skip
    return line, None if eta is None else rounds * eta
