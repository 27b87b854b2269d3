"""What one cell runs (:class:`CellPlan`), the one table of number rules every entry point
checks its numbers against, and the rough wall-time estimate of a plan (pure).

Problems are returned as one-line strings (empty = fine); the shell turns the first into a
:class:`~batch_invariance.errors.UsageError`. ``spell`` names an option the way the caller's
user wrote it: ``--ctx`` on the command line, ``input ctx`` in the Action.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from batch_invariance.core.workitem import WorkItem

__all__ = [
    "ETA_CONCURRENT_SPEEDUP",
    "ETA_MS_PER_TOKEN_PER_GIB",
    "ETA_SERVER_LOAD_S",
    "NUMBER_RULES",
    "CellPlan",
    "Endpoint",
    "NumberRule",
    "cli_spelling",
    "eta_seconds",
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


#: Every numeric option of a cell, by field name (one table for CLI, Action and plan).
NUMBER_RULES: Mapping[str, NumberRule] = {
    "ctx": NumberRule(1),
    "parallel": NumberRule(2, why="for the C arm to co-batch anything"),
    "gate_passes": NumberRule(1),
    "cache_passes": NumberRule(0),
    "cache_ram": NumberRule(0),
    "cache_shape": NumberRule(1, why="turns per conversation"),
    "reps": NumberRule(1),
    "n_predict": NumberRule(1),
    "min_hot_trials": NumberRule(1),
    "n_probs": NumberRule(2, why="the top-1 vs top-2 margin needs two"),
    "req_timeout": NumberRule(0, exclusive=True),
    "ready_timeout": NumberRule(0, exclusive=True),
    "max_footprint_gb": NumberRule(0, exclusive=True),
}


def cli_spelling(name: str) -> str:
    """``gate_passes`` -> ``--gate-passes`` (how the command line names a field)."""
    return "--" + name.replace("_", "-")


def number_problems(
    values: Mapping[str, float | None], spell: Callable[[str], str] = cli_spelling
) -> tuple[str, ...]:
    """What is wrong with ``values`` under :data:`NUMBER_RULES` (``None`` = not given)."""
    problems: list[str] = []
    for name, value in values.items():
        rule = NUMBER_RULES[name]
        if value is None:
            continue
        if rule.exclusive and value <= rule.minimum:
            problems.append(f"{spell(name)} must be positive (got {value:g})")
        elif not rule.exclusive and value < rule.minimum:
            why = f" {rule.why}" if rule.why else ""
            problems.append(f"{spell(name)} must be at least {rule.minimum:g}{why} (got {value:g})")
    return tuple(problems)


@dataclass(frozen=True)
class CellPlan:
    """What to run for one cell.

    ``items`` are the final test items (already expanded by ``--reps``), ``ctx`` the tokens
    every slot gets, ``parallel`` the N of the B/C server, ``gate_passes`` the number T of
    concurrent C passes.
    """

    items: tuple[WorkItem, ...]
    ctx: int
    parallel: int
    gate_passes: int = 8
    n_predict: int = 128
    seed: int = 0
    endpoint: Endpoint = "chat"
    n_probs: int | None = None
    serial_repeat: bool = True
    req_timeout: float = 120.0
    #: End the C passes at the first that proves RED (``core.schedule.red_proof``).
    stop_on_red: bool = False
    #: Passes of the prompt-cache arm (``core.cache_arm``): 0 leaves the cache unmeasured.
    cache_passes: int = 0
    #: Run B on a seeded sample when every C pass equals A bitwise (``core.b_sample``).
    b_sample: bool = False

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
        return tuple(found) + number_problems(
            {
                "ctx": self.ctx,
                "parallel": self.parallel,
                "gate_passes": self.gate_passes,
                "cache_passes": self.cache_passes,
                "n_predict": self.n_predict,
                "n_probs": self.n_probs,
                "req_timeout": self.req_timeout,
            }
        )


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
