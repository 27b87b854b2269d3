"""What one cell runs (:class:`CellPlan`) and how it is measured (:class:`Measurement`), the
number rules every entry point checks its numbers against, and the rough wall-time estimate of
a plan (pure).

A number's rule sits on its field (:func:`number_field`): :func:`number_problems` reads the
fields of a value and of the values it is composed of, so the request, the job and the plan
carry one :class:`Measurement` and check it one way. Problems are returned as one-line
strings (empty = fine); the shell turns the first into a
:class:`~batch_invariance.errors.UsageError`. ``spell`` names an option the way the caller's
user wrote it: ``--ctx`` on the command line, ``input ctx`` in the Action.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Literal

from batch_invariance.core.workitem import WorkItem

__all__ = [
    "CTX",
    "ETA_CONCURRENT_SPEEDUP",
    "ETA_MS_PER_TOKEN_PER_GIB",
    "ETA_SERVER_LOAD_S",
    "PARALLEL",
    "CellPlan",
    "CellSize",
    "Endpoint",
    "Measurement",
    "NumberRule",
    "cli_spelling",
    "eta_seconds",
    "number_field",
    "number_problems",
    "serial_arm_count",
]


Endpoint = Literal["chat", "completions"]


@dataclass(frozen=True)
class NumberRule:
    """The smallest value an option takes; ``exclusive`` means the value must exceed it."""

    minimum: float
    exclusive: bool = False
    why: str = ""

    def problem(self, spelled: str, value: float | None) -> str | None:
        """What is wrong with ``value`` (``None``: not given, nothing to check)."""
        if value is None:
            return None
        if self.exclusive and value <= self.minimum:
            return f"{spelled} must be positive (got {value:g})"
        if not self.exclusive and value < self.minimum:
            why = f" {self.why}" if self.why else ""
            return f"{spelled} must be at least {self.minimum:g}{why} (got {value:g})"
        return None


_RULE = "number_rule"

#: The rules of the cell's size, shared by every value that carries it.
CTX = NumberRule(1)
PARALLEL = NumberRule(2, why="for the C arm to co-batch anything")
N_PROBS = NumberRule(2, why="the top-1 vs top-2 margin needs two")


def number_field(rule: NumberRule, default: Any = MISSING) -> Any:
    """A dataclass field holding a number under ``rule`` (``default`` when given):
    :func:`number_problems` reads it."""
    return field(default=default, metadata={_RULE: rule})


def cli_spelling(name: str) -> str:
    """``gate_passes`` -> ``--gate-passes`` (how the command line names a field)."""
    return "--" + name.replace("_", "-")


def number_problems(values: Any, spell: Callable[[str], str] = cli_spelling) -> tuple[str, ...]:
    """What is wrong with the numbers of the dataclass ``values``: each field made by
    :func:`number_field` against its own rule, and the fields of the values it is composed of,
    in field order. The one check of every entry point's numbers (``spell`` names a field
    the way its user wrote it: ``--ctx`` on the command line, ``input ctx`` in the Action)."""
    problems: list[str] = []
    for f in fields(values):
        value = getattr(values, f.name)
        rule = f.metadata.get(_RULE)
        if rule is not None:
            problem = rule.problem(spell(f.name), value)
            problems.extend(() if problem is None else (problem,))
        elif is_dataclass(value) and not isinstance(value, type):
            problems.extend(number_problems(value, spell))
    return tuple(problems)


@dataclass(frozen=True)
class CellSize:
    """A cell's size, where it is checked on its own: tokens per slot and N."""

    ctx: int | None = number_field(CTX, None)
    parallel: int | None = number_field(PARALLEL, None)


@dataclass(frozen=True)
class Measurement:
    """How every arm and pass of a cell is measured: one value from the command line (or the
    Action) through the job into the plan. A new numeric option is one field here, with its
    rule; the command line reads it, the driver uses it."""

    #: The number T of concurrent C passes.
    gate_passes: int = number_field(NumberRule(1), 8)
    #: Each work-set row repeated R times.
    reps: int = number_field(NumberRule(1), 3)
    #: The token budget per request.
    n_predict: int = number_field(NumberRule(1), 128)
    seed: int = 0
    endpoint: Endpoint = "chat"
    #: Top-K pre-sampling logprobs per token (``None``: the driver's own).
    n_probs: int | None = number_field(N_PROBS, None)
    #: Run A' (the serial repeat) when B differs from A.
    serial_repeat: bool = True
    #: End the C passes at the first that proves RED (``core.schedule.red_proof``).
    stop_on_red: bool = False
    req_timeout: float = number_field(NumberRule(0, exclusive=True), 120.0)
    #: Passes of the prompt-cache arm (``core.cache_arm``): 0 leaves the cache unmeasured.
    cache_passes: int = number_field(NumberRule(0), 0)


@dataclass(frozen=True)
class CellPlan:
    """What to run for one cell.

    ``items`` are the final test items (already expanded by ``measurement.reps``), ``ctx``
    the tokens every slot gets, ``parallel`` the N of the B/C server, ``measurement`` how
    every arm and pass is measured (its fields are read through, ``plan.gate_passes``).
    """

    items: tuple[WorkItem, ...]
    ctx: int = number_field(CTX)
    parallel: int = number_field(PARALLEL)
    measurement: Measurement = Measurement()
    #: Run B on a seeded sample when every C pass equals A bitwise (``core.b_sample``).
    b_sample: bool = False

    @property
    def gate_passes(self) -> int:
        return self.measurement.gate_passes

    @property
    def n_predict(self) -> int:
        return self.measurement.n_predict

    @property
    def seed(self) -> int:
        return self.measurement.seed

    @property
    def endpoint(self) -> Endpoint:
        return self.measurement.endpoint

    @property
    def n_probs(self) -> int | None:
        return self.measurement.n_probs

    @property
    def serial_repeat(self) -> bool:
        return self.measurement.serial_repeat

    @property
    def req_timeout(self) -> float:
        return self.measurement.req_timeout

    @property
    def stop_on_red(self) -> bool:
        return self.measurement.stop_on_red

    @property
    def cache_passes(self) -> int:
        return self.measurement.cache_passes

    @property
    def n_requests(self) -> int:
        """Requests this plan sends at most, A' aside: A, B and every C pass. A' adds one
        more round when it runs (only when B differs from A); an early stop on RED, and B on
        a RED cell's divergent ids only, send fewer."""
        return len(self.items) * (2 + self.gate_passes + self.cache_passes)

    def problems(self) -> tuple[str, ...]:
        """Why this plan cannot run (empty = it can)."""
        found: list[str] = []
        if not self.items:
            found.append("the work-set is empty; give at least one row")
        ids = [i.test_id for i in self.items]
        if len(set(ids)) != len(ids):
            found.append("test ids must be unique within a cell")
        return tuple(found) + number_problems(self)


def serial_arm_count(serial_repeat: bool) -> int:
    """Serial arms per cell: A and B, plus A' when the serial repeat runs."""
    return 3 if serial_repeat else 2


#: Rough CPU generation cost, measured on the embedded default (Gemma 3 270M Q4_K_M,
#: 2 cores): ~13 ms per token per 0.236 GiB of weights; concurrent passes ran ~2x faster
#: than serial at N=4; each of the two servers takes ~5 s to load.
ETA_MS_PER_TOKEN_PER_GIB = 13.0 / 0.236
ETA_CONCURRENT_SPEEDUP = 2.0
ETA_SERVER_LOAD_S = 5.0
_GIB = 1024**3


def eta_seconds(
    model_bytes: int,
    n_items: int,
    *,
    n_predict: int,
    gate_passes: int,
    serial_repeat: bool,
    cpus: int,
) -> float:
    """A rough wall-time estimate of a cell from model size and CPU count."""
    per_token_s = ETA_MS_PER_TOKEN_PER_GIB * (model_bytes / _GIB) / 1000.0
    per_token_s *= 2.0 / max(cpus, 1)
    per_request = per_token_s * n_predict
    serial = n_items * per_request * serial_arm_count(serial_repeat)
    concurrent = gate_passes * n_items * per_request / ETA_CONCURRENT_SPEEDUP
    return 2 * ETA_SERVER_LOAD_S + serial + concurrent
