"""What one cell runs (:class:`CellPlan`) and how it is measured (:class:`Measurement`), the
number rules every entry point checks its numbers against, and the rough wall-time estimate of
a plan (pure).

A number's rule sits on its field (:func:`number_field`): :func:`number_problems` reads the
fields of a value and of the values it is composed of, so the request, the job and the plan
carry one :class:`Measurement` and check it one way. Problems are returned as one-line
strings (empty = fine); the shell turns the first into a
:class:`~batch_invariance.errors.UsageError`. ``spell`` names an option the way the caller's
user wrote it: ``--ctx`` on the command line, ``input ctx`` in the Action.

One prompt to measure: the unit every arm sends and every scorer judges.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Literal

__all__ = [
    "CTX",
    "DEFAULT_GATE_PASSES",
    "DEFAULT_REPS",
    "ETA_CONCURRENT_SPEEDUP",
    "ETA_MS_PER_TOKEN_PER_GIB",
    "ETA_SERVER_LOAD_S",
    "PARALLEL",
    "REP_SEPARATOR",
    "CellPlan",
    "CellSize",
    "Endpoint",
    "Measurement",
    "NumberRule",
    "WorkItem",
    "batch_eta_seconds",
    "cli_spelling",
    "duplicate_prompts",
    "eta_seconds",
    "normalise_whitespace",
    "number_field",
    "number_problems",
    "prompt_text",
    "rep_id",
    "request_key",
    "row_id",
    "serial_arm_count",
]


Endpoint = Literal["chat", "completions"]

#: The default schedule of every entry point (``run-live``, ``sweep``, ``demo``, the Action,
#: and whatever else builds a :class:`Measurement` without naming these): each work-set row
#: once, in two concurrent C passes. Chosen by detection power per request (docs/power.md):
#: when a prompt's co-batched runs change together, repetitions and passes add nothing and
#: only distinct prompts buy power, so a row is never repeated by default. Two passes, not
#: one: the sample-size gate needs 30 co-batched comparisons and one pass of the ladder's 32
#: prompts would leave a margin of two; the second pass also puts every prompt beside other
#: partners, which is what buys power when runs change on their own.
DEFAULT_GATE_PASSES = 2
DEFAULT_REPS = 1


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
    gate_passes: int = number_field(NumberRule(1), DEFAULT_GATE_PASSES)
    #: Each work-set row repeated R times.
    reps: int = number_field(NumberRule(1), DEFAULT_REPS)
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
    #: Run B on a seeded sample when every C pass equals A bitwise (``core.schedule``).
    b_sample: bool = False
    #: The B/C server's unified KV pool (``ctx * parallel`` tokens that any slot may fill),
    #: ``None`` for a split cache: the passes then keep the requests in flight within it
    #: (:mod:`batch_invariance.core.kv_budget`) and the serial servers hold the whole pool.
    kv_pool: int | None = None

    @property
    def serial_ctx(self) -> int:
        """The context of the ``--parallel 1`` servers (A, A'): one slot as long as the
        longest sequence a slot of the B/C server can hold (the pool, where it is unified)."""
        return self.kv_pool if self.kv_pool is not None else self.ctx

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
    per_request = _request_s(model_bytes, n_predict, cpus)
    serial = n_items * per_request * serial_arm_count(serial_repeat)
    concurrent = gate_passes * n_items * per_request / ETA_CONCURRENT_SPEEDUP
    return 2 * ETA_SERVER_LOAD_S + serial + concurrent


def _request_s(model_bytes: int, n_predict: int, cpus: int) -> float:
    per_token_s = ETA_MS_PER_TOKEN_PER_GIB * (model_bytes / _GIB) / 1000.0
    return per_token_s * 2.0 / max(cpus, 1) * n_predict


def batch_eta_seconds(model_bytes: int, n_items: int, *, n_predict: int, cpus: int) -> float:
    """The same rough estimate for one server started and one concurrent batch of
    ``n_items`` requests on it (a round side of the search's interleaved comparison)."""
    per_request = _request_s(model_bytes, n_predict, cpus)
    return ETA_SERVER_LOAD_S + n_items * per_request / ETA_CONCURRENT_SPEEDUP


#: Repetitions of one work-set row get ids ``{row id}{REP_SEPARATOR}{k}``.
REP_SEPARATOR = "#r"


def rep_id(row: str, k: int) -> str:
    """The test id of repetition ``k`` of work-set row ``row``."""
    return f"{row}{REP_SEPARATOR}{k}"


def row_id(test_id: str) -> str:
    """The work-set row a test id repeats (the id without its ``#rK`` suffix).

    Repetitions of one prompt are not independent samples: where a cert carries no request
    keys, the per-prompt bound counts rows. An id that only looks like a repetition is folded
    too, which can only under-count rows.
    """
    head, sep, tail = test_id.rpartition(REP_SEPARATOR)
    return head if sep and head and tail.isdigit() else test_id


def normalise_whitespace(text: str) -> str:
    """``text`` with every run of whitespace one space and none at either end: two prompts
    that differ only there are one prompt, not two independent samples."""
    return " ".join(text.split())


def _normalised(value: Any) -> Any:
    if isinstance(value, str):
        return normalise_whitespace(value)
    if isinstance(value, Mapping):
        return {str(k): _normalised(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalised(v) for v in value]
    return value


def request_key(path: str, body: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of one request as the server sees it: the endpoint ``path`` and the
    JSON ``body`` (prompt or messages, token budget, stop, sampling fields), every string
    whitespace-normalised. Two ids with one key are one distinct prompt. The caller leaves out
    what differs per id or per arm without changing what is asked (the per-id seed, which
    greedy decoding ignores, and the logprob fields)."""
    text = json.dumps(_normalised(body), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(f"{path}\n{text}".encode()).hexdigest()


@dataclass(frozen=True)
class WorkItem:
    """One prompt to measure, with what the scorer needs to judge it."""

    test_id: str
    prompt: str | None
    messages: tuple[tuple[str, str], ...] | None
    expected_answer: str | None = None
    family: str | None = None
    fill: float | None = None
    system: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def with_id(self, test_id: str) -> WorkItem:
        """The same item under another test id (used for repetitions)."""
        return WorkItem(
            test_id=test_id,
            prompt=self.prompt,
            messages=self.messages,
            expected_answer=self.expected_answer,
            family=self.family,
            fill=self.fill,
            system=self.system,
            meta=self.meta,
        )


def prompt_text(item: WorkItem) -> str:
    """The item's prompt as one whitespace-normalised text (system, then the prompt or each
    message with its role): the work-set's own notion of "the same prompt"."""
    parts = [] if item.system is None else [f"system: {item.system}"]
    if item.messages is not None:
        parts.extend(f"{role}: {content}" for role, content in item.messages)
    else:
        parts.append(f"prompt: {item.prompt or ''}")
    return normalise_whitespace("\n".join(parts))


def duplicate_prompts(items: Sequence[WorkItem]) -> tuple[tuple[str, ...], ...]:
    """Groups of ids (in work-set order) whose rows carry the same prompt, whitespace aside;
    repetitions of one row (``#rK``) are one row, not duplicates. Empty when every row is
    distinct."""
    by_text: dict[str, list[str]] = {}
    for item in items:
        ids = by_text.setdefault(prompt_text(item), [])
        if row_id(item.test_id) not in map(row_id, ids):
            ids.append(item.test_id)
    return tuple(tuple(ids) for ids in by_text.values() if len(ids) > 1)
