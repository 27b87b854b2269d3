"""What a comparison of two arms reports (pure values): the :class:`PairReport` of
:mod:`batch_invariance.core.diff` with its per-id rows and per-group and per-pass counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Scalar = str | float | int | bool | None
RowKind = Literal["invariant", "missing", "token_only"]
Outcome = Literal["skipped", "divergent", "token_only", "clean"]


@dataclass(frozen=True)
class DivergenceRow:
    """One differing comparison: which id, in which pass, which field and how."""

    test_id: str
    #: The C pass this comparison came from; ``None`` for AB.
    pass_index: int | None
    kind: RowKind
    #: First differing invariant field; ``"presence"`` for a missing id, ``"content"`` for
    #: token-only rows.
    field: str
    #: Every differing invariant field, in :data:`INVARIANT_FIELDS` order.
    fields: tuple[str, ...]
    x: Scalar
    y: Scalar
    x_content_sha: str | None
    y_content_sha: str | None
    #: Whether the generated token streams are identical; ``None`` when tokens are unknown.
    token_identical: bool | None
    #: Index of the first differing token when both token streams are known.
    first_divergent_token: int | None
    #: top-1 minus top-2 logprob at ``first_divergent_token`` in x and in y, when recorded.
    x_top_margin: float | None
    y_top_margin: float | None
    x_excerpt: str | None
    y_excerpt: str | None


@dataclass(frozen=True)
class GroupCount:
    """Ids compared, divergent and token-only within one group (family or fill bucket)."""

    n_compared: int
    n_divergent: int
    n_token_only: int


@dataclass(frozen=True)
class PassCount:
    """Comparison counts for one C pass of a union report (id-level within that pass)."""

    index: int
    n_compared: int
    n_divergent: int
    n_token_only: int
    n_skipped: int


@dataclass(frozen=True)
class PairReport:
    """The comparison of two arms (``y`` may be the union of several C passes)."""

    pair: str
    n_compared: int
    n_divergent: int
    divergence_rate: float
    divergent_ids: tuple[str, ...]
    only_x: tuple[str, ...]
    only_y: tuple[str, ...]
    n_token_only: int
    token_divergence_ids: tuple[str, ...]
    #: Ids with at least one comparison skipped because of a transport failure.
    transport_skipped_ids: tuple[str, ...]
    per_id: tuple[DivergenceRow, ...]
    by_family: Mapping[str, GroupCount]
    by_fill: Mapping[str, GroupCount]
    per_pass: tuple[PassCount, ...]

    @property
    def clean(self) -> bool:
        """True when no id diverged (token-only differences do not count)."""
        return self.n_divergent == 0


def ac_summary(ac: PairReport) -> str:
    """RED's first reason: how many ids diverged, the first one, and ids missing on a side."""
    first = ac.per_id[0] if ac.per_id else None
    where = ""
    if first is not None and first.kind == "missing":
        side = "C" if first.x == "present" else "A"
        where = f"; first: {first.test_id} missing from {side}"
        if first.pass_index is not None:
            where += f" in pass {first.pass_index}"
    elif first is not None:
        where = f"; first: {first.test_id} field {first.field}"
        if first.pass_index is not None:
            where += f" in pass {first.pass_index}"
    missing = sorted(set(ac.only_x) | set(ac.only_y))
    gone = f"; missing on one side: {', '.join(missing[:5])}" if missing else ""
    more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
    return (
        f"AC: {ac.n_divergent} of {ac.n_compared} ids diverged from A in an invariant field "
        f"or by being missing, on at least one C pass{where}{gone}{more}"
    )
