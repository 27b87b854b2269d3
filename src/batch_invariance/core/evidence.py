"""Typed values that flow from the driver into the pure verdict core.

Everything here is a frozen dataclass with no behaviour beyond derived views: the driver
(imperative shell) fills these in, :mod:`batch_invariance.core.verdict` and
:mod:`batch_invariance.cert.certificate` read them. Nothing here touches sockets, files or clocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ARM_A",
    "ARM_A_REPEAT",
    "ARM_B",
    "ARM_C",
    "ARM_CACHE",
    "DEFAULT_COMPLETION_FLOOR",
    "DEFAULT_COVERAGE_FRACTION",
    "DEFAULT_LOGIT_EPS",
    "DEFAULT_MAX_BOUND",
    "DEFAULT_MIN_ANSWER_TOKENS",
    "DEFAULT_MIN_HOT_TRIALS",
    "DEFAULT_MIN_SLOT_FILL",
    "DEFAULT_OVERLAP_MARGIN_S",
    "FINISH_LENGTH",
    "FINISH_STOP",
    "INVARIANT_FIELDS",
    "OK",
    "SCORER_ERROR",
    "TRANSPORT_MODES",
    "CellEvidence",
    "CellSpec",
    "GatePolicy",
    "ItemMeta",
    "PassRecord",
    "Trial",
    "policy_problems",
    "policy_usage_problems",
]


#: Trial fields that must match exactly (never with a tolerance) between arms.
INVARIANT_FIELDS: tuple[str, ...] = (
    "score",
    "passed",
    "extracted_answer",
    "expected_answer",
    "prompt_tokens_measured",
    "failure_mode",
)

#: The failure mode of a genuinely scored trial.
OK = "ok"

#: Failure modes that mean the request never produced a completion to judge. They are not
#: numeric divergence: they never make a RED on their own, and they make GREEN impossible.
TRANSPORT_MODES: frozenset[str] = frozenset(
    {"timeout", "connection_error", "http_error", "server_gone"}
)

#: Failure mode recorded when a user scorer raises on a trial.
SCORER_ERROR = "scorer_error"

#: ``finish_reason`` values: the model stopped by itself, or the token budget cut it.
FINISH_STOP = "stop"
FINISH_LENGTH = "length"

#: Arm names used in evidence and reports.
ARM_A = "A"
ARM_A_REPEAT = "A_repeat"
ARM_B = "B"
ARM_C = "C"
ARM_CACHE = "cache"


@dataclass(frozen=True, slots=True)
class Trial:
    """One request's outcome in one arm (and pass).

    The first block is the invariant record compared for exact equality; the rest are
    diagnostics that explain a divergence but never gate a verdict.
    """

    test_id: str
    score: float | None
    passed: bool | None
    extracted_answer: str | None
    expected_answer: str | None
    prompt_tokens_measured: int | None
    failure_mode: str
    # --- diagnostics ---
    completion: str | None = None
    content_sha256: str | None = None
    #: Generated-token count as the server reported it (``usage.completion_tokens`` or
    #: ``tokens_predicted``); ``None`` when it reported none. Also read as ``generated_tokens``.
    completion_tokens: int | None = None
    #: Why generation ended: "stop", "length" (cut by the token budget) or another word.
    finish_reason: str | None = None
    #: Generated tokens as the server reported them (ids or pieces), when available.
    tokens: tuple[str, ...] | None = None
    #: Chosen-token logprob at each position, when the run asked for them.
    token_logprobs: tuple[float, ...] | None = None
    #: top-1 minus top-2 logprob at each position (None where fewer than two alternatives).
    top_margins: tuple[float | None, ...] | None = None
    #: Client-side monotonic timestamps of the request (seconds).
    dispatch_ts: float | None = None
    complete_ts: float | None = None
    slot_id: int | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    transport_error: str | None = None
    #: A serial request retried once after a transient failure: that first attempt's
    #: ``"failure_mode: detail"`` (the fields above are the retry's).
    first_attempt: str | None = None

    def invariant(self) -> tuple[Any, ...]:
        """The invariant fields as a tuple, in :data:`INVARIANT_FIELDS` order."""
        return tuple(getattr(self, name) for name in INVARIANT_FIELDS)

    @property
    def generated_tokens(self) -> int | None:
        """The server-reported generated-token count (the ``completion_tokens`` field)."""
        return self.completion_tokens

    @property
    def cut_by_budget(self) -> bool:
        """True when the token budget ended the answer (``finish_reason == "length"``)."""
        return self.finish_reason == FINISH_LENGTH

    @property
    def is_ok(self) -> bool:
        """True when the trial was genuinely scored."""
        return self.failure_mode == OK

    @property
    def is_transport_failure(self) -> bool:
        """True when the request never produced a completion to judge."""
        return self.failure_mode in TRANSPORT_MODES

    @property
    def has_interval(self) -> bool:
        return self.dispatch_ts is not None and self.complete_ts is not None


@dataclass(frozen=True)
class PassRecord:
    """One concurrent (C) pass: its trials and what the server said about its slots."""

    index: int
    trials: Mapping[str, Trial]
    #: Most slots the server itself reported busy at once during this pass (from ``/slots``
    #: or ``/metrics``); ``None`` when the server gave no usable signal.
    server_busy_max: int | None
    #: Where ``server_busy_max`` came from: "slots", "metrics", "mock" or "none".
    busy_source: str = "none"
    #: The dispatch order used for this pass (ids), for the record.
    order: tuple[str, ...] = ()


@dataclass(frozen=True)
class ItemMeta:
    """What the report groups by for one test id, and which request it sent.

    ``request_key`` (:func:`~batch_invariance.core.plan.request_key`) names the request
    content the server saw: ids with one key are one distinct prompt for the per-prompt bound.
    ``None`` only in certs written before it was recorded (their ids count by work-set row).
    """

    test_id: str
    family: str | None = None
    fill: float | None = None
    request_key: str | None = None


@dataclass(frozen=True)
class CellEvidence:
    """Everything the verdict is derived from, for one (model, ctx, N) cell.

    ``a`` is ground truth (``--parallel 1``, serial), ``a_repeat`` the optional serial repeat
    on the same server, ``b`` the ``--parallel N`` serial control and ``c_passes`` the
    concurrent passes under test. Maps are ``{test_id: Trial}``.

    ``b_ids`` is ``None`` when arm B ran on every id. On a RED cell B runs only on the ids
    that diverged from A (the only ids where B decides something: the divergence class);
    ``b_ids`` then names them, AB and BC compare only those, and the B-scope gate keeps such
    a cell from being anything but RED.
    """

    items: tuple[ItemMeta, ...]
    a: Mapping[str, Trial]
    a_repeat: Mapping[str, Trial] | None
    b: Mapping[str, Trial]
    c_passes: tuple[PassRecord, ...]
    b_ids: tuple[str, ...] | None = None
    #: The prompt-cache arm's passes (:mod:`batch_invariance.core.cache_arm`): the same ids
    #: sent as a deployed client sends them, with the server's prompt cache on, concurrently
    #: at N. ``None``: the cache was not measured (every cert written before it could be).
    cache_passes: tuple[PassRecord, ...] | None = None
    #: Tokens per slot of the cell measured (``CellSpec.ctx``): the sequence-scope rule
    #: (:mod:`batch_invariance.core.scope`) holds the measured lengths against it. ``None``:
    #: not recorded (every cert written before the rule), and the rule is not applied.
    slot_ctx: int | None = None


#: The gate policy defaults. A recorded policy looser than these is never promotable
#: (:func:`policy_problems`); stricter is always allowed.
DEFAULT_MIN_HOT_TRIALS = 30
DEFAULT_COMPLETION_FLOOR = 0.80
DEFAULT_COVERAGE_FRACTION = 0.80
DEFAULT_OVERLAP_MARGIN_S = 0.005
#: A GREEN needs the median generated length of the hot comparisons at or above this.
DEFAULT_MIN_ANSWER_TOKENS = 64
#: A GREEN needs the 95% upper bound on the per-prompt divergence rate at or below this
#: (rule of three: 30 or more distinct prompts, none diverging).
DEFAULT_MAX_BOUND = 0.10
#: F4 is armed at exact (bitwise) equality of the logprobs.
DEFAULT_LOGIT_EPS = 0.0
#: A GREEN needs its longest co-batched sequence (prompt + answer) at 3/4 of the slot or more.
DEFAULT_MIN_SLOT_FILL = 0.75


@dataclass(frozen=True)
class GatePolicy:
    """Thresholds of the anti-vacuity gates. Recorded in every cert."""

    min_hot_trials: int = DEFAULT_MIN_HOT_TRIALS
    completion_floor: float = DEFAULT_COMPLETION_FLOOR
    coverage_fraction: float = DEFAULT_COVERAGE_FRACTION
    #: Two request intervals only count as co-batched when they overlap by at least this.
    overlap_margin_s: float = DEFAULT_OVERLAP_MARGIN_S
    #: F4: numeric drift larger than this (any AC row, any pass) is not GREEN. 0, the
    #: default, is exact equality; a positive eps is looser and never promotable.
    logit_eps: float = DEFAULT_LOGIT_EPS
    min_answer_tokens: int = DEFAULT_MIN_ANSWER_TOKENS
    max_bound: float = DEFAULT_MAX_BOUND
    #: The share of its slot a cell's longest co-batched sequence must reach
    #: (:mod:`batch_invariance.core.scope`); ``None`` is the default, 3/4. Absent from
    #: certs that keep the default, so certs written before it verify as written.
    min_slot_fill: float | None = None


def policy_usage_problems(policy: GatePolicy) -> tuple[str, ...]:
    """What makes ``policy`` unusable at all, named by its CLI option (empty = usable)."""
    problems: list[str] = []
    if policy.min_hot_trials < 1:
        problems.append(f"--min-hot-trials must be at least 1 (got {policy.min_hot_trials})")
    if policy.min_answer_tokens < 1:
        problems.append(f"--min-answer-tokens must be at least 1 (got {policy.min_answer_tokens})")
    if not policy.logit_eps >= 0.0:
        problems.append(f"--logit-eps must be 0 or more (got {policy.logit_eps:g})")
    if not 0.0 < policy.max_bound <= 1.0:
        problems.append(f"--max-bound must be a rate in (0, 1] (got {policy.max_bound:g})")
    fill = policy.min_slot_fill
    if fill is not None and not 0.0 <= fill <= 1.0:
        problems.append(f"--min-slot-fill must be a share in [0, 1] (got {fill:g})")
    return tuple(problems)


def policy_problems(policy: GatePolicy) -> tuple[str, ...]:
    """Why ``policy`` is looser than the defaults, one line each; empty when it is not.

    The one promotability rule for a recorded policy: a cert judged under any looser
    threshold may still show its verdict, but it is never promotable.
    """
    problems: list[str] = []

    def looser(name: str, value: float, default: float, lower_is_looser: bool) -> None:
        if value != value:  # NaN compares false with everything: never acceptable
            problems.append(f"policy {name} is not a number")
        elif value < default if lower_is_looser else value > default:
            side = "lower" if lower_is_looser else "higher"
            problems.append(
                f"policy {name} {value} is looser than the default {default} ({side} is looser)"
            )

    looser("min_hot_trials", policy.min_hot_trials, DEFAULT_MIN_HOT_TRIALS, True)
    looser("completion_floor", policy.completion_floor, DEFAULT_COMPLETION_FLOOR, True)
    looser("coverage_fraction", policy.coverage_fraction, DEFAULT_COVERAGE_FRACTION, True)
    looser("overlap_margin_s", policy.overlap_margin_s, DEFAULT_OVERLAP_MARGIN_S, True)
    looser("min_answer_tokens", policy.min_answer_tokens, DEFAULT_MIN_ANSWER_TOKENS, True)
    looser("max_bound", policy.max_bound, DEFAULT_MAX_BOUND, False)
    looser("logit_eps", policy.logit_eps, DEFAULT_LOGIT_EPS, False)
    if policy.min_slot_fill is not None:
        looser("min_slot_fill", policy.min_slot_fill, DEFAULT_MIN_SLOT_FILL, True)
    return tuple(problems)


@dataclass(frozen=True)
class CellSpec:
    """Identity of the cell a cert speaks for."""

    model: str
    ctx: int
    dispatch_n: int
    kv_label: str
    reps: int
    gate: str = "abc_union"
    #: From the GGUF header when known (expert count > 0); ``None`` when unknown.
    is_moe: bool | None = None
