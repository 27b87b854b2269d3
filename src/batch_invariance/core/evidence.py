"""Typed values that flow from the driver into the pure verdict core.

Everything here is a frozen dataclass with no behaviour beyond derived views: the driver
(imperative shell) fills these in, :mod:`batch_invariance.core.verdict` and
:mod:`batch_invariance.cert.certificate` read them. Nothing here touches sockets, files or clocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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

#: Arm names used in evidence and reports.
ARM_A = "A"
ARM_A_REPEAT = "A_repeat"
ARM_B = "B"
ARM_C = "C"


@dataclass(frozen=True)
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
    completion_tokens: int | None = None
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

    def invariant(self) -> tuple[Any, ...]:
        """The invariant fields as a tuple, in :data:`INVARIANT_FIELDS` order."""
        return tuple(getattr(self, name) for name in INVARIANT_FIELDS)

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
    """What the report groups by for one test id."""

    test_id: str
    family: str | None = None
    fill: float | None = None


@dataclass(frozen=True)
class CellEvidence:
    """Everything the verdict is derived from, for one (model, ctx, N) cell.

    ``a`` is ground truth (``--parallel 1``, serial), ``a_repeat`` the optional serial repeat
    on the same server, ``b`` the ``--parallel N`` serial control and ``c_passes`` the
    concurrent passes under test. Maps are ``{test_id: Trial}``.
    """

    items: tuple[ItemMeta, ...]
    a: Mapping[str, Trial]
    a_repeat: Mapping[str, Trial] | None
    b: Mapping[str, Trial]
    c_passes: tuple[PassRecord, ...]


@dataclass(frozen=True)
class GatePolicy:
    """Thresholds of the anti-vacuity gates. Recorded in every cert."""

    min_hot_trials: int = 30
    completion_floor: float = 0.80
    coverage_fraction: float = 0.80
    #: Two request intervals only count as co-batched when they overlap by at least this.
    overlap_margin_s: float = 0.005
    #: F4: per-token logprob drift threshold; ``None`` leaves F4 disarmed.
    logit_eps: float | None = None


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
