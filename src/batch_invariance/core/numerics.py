"""Numeric evidence: every arm's pre-sampling logprobs compared bitwise (pure).

Each trial carries, per generated token, the chosen token's logprob and the top-1 minus top-2
margin (both taken before sampling). Two trials of one id are compared position by position
up to their first token difference; a position *drifts* when either value differs at all
(exact float equality, never a tolerance). Its delta is the larger of
``|delta chosen logprob|`` and ``|delta margin|``.

Per pair (AC, AB, BC, AA) and per pass this gives the positions compared, the rows whose
numerics drifted, the first drift position and the largest delta: a batch-variant cell shows
drift on nearly every row long before a token flips, a batch-invariant one shows none.

:func:`evidence_gate` says whether every compared trial of every arm carries logprobs at
every position (and they do not look rounded): without that, equal tokens prove nothing about
the numerics and no GREEN is earned.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from batch_invariance.core.evidence import Trial

__all__ = ["RISK_LENGTHS", "ROUNDED_DECIMALS", "ROUNDED_MIN_VALUES", "NumericEvidenceGate",
           "Numerics", "PairNumerics", "PassNumerics", "RiskEstimate", "RiskPoint", "RowNumerics",
           "cell_numerics", "compare_pair", "drift_words", "evidence_gate", "has_logprobs",
           "numeric_statement"]  # fmt: skip


#: Logprobs whose every non-zero value has at most this many decimals were rounded by the
#: engine (a float32 logprob printed in full has about 9 significant digits).
ROUNDED_DECIMALS = 4
#: A rounding verdict needs at least this many non-zero values (a few short values can be
#: round by chance).
ROUNDED_MIN_VALUES = 16
#: The answer lengths the divergence-risk estimate is given at.
RISK_LENGTHS: tuple[int, ...] = (64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class RowNumerics:
    """One id in one pass whose numerics drifted or whose tokens differ."""

    test_id: str
    pass_index: int | None
    #: Positions compared: up to the first token difference (or the shorter stream).
    positions: int
    #: First position whose logprob or margin differs; ``None`` when all compared are equal.
    first_drift: int | None
    #: Largest delta over the compared positions (0.0 when bitwise equal).
    max_abs_delta: float
    #: First position whose token differs (a length difference counts); ``None``: same tokens.
    token_flip: int | None


@dataclass(frozen=True)
class PassNumerics:
    """One pass of a pair (``pass_index`` is ``None`` for AB and AA)."""

    pass_index: int | None
    #: Ids compared with logprobs on both sides (transport failures are skipped).
    rows_compared: int
    #: Ids answered on both sides where either side lacks logprobs at some position.
    rows_without_logprobs: int
    positions: int
    rows_with_drift: int
    rows_with_token_flip: int
    #: Smallest first-drift position over the pass's rows.
    first_drift_position: int | None
    max_abs_delta: float | None


@dataclass(frozen=True)
class PairNumerics:
    """The numerics of one pair: per pass, and the rows that drifted or flipped."""

    pair: str
    per_pass: tuple[PassNumerics, ...]
    #: Every (id, pass) whose numerics drifted or whose tokens differ, sorted by (id, pass).
    rows: tuple[RowNumerics, ...]
    #: Ids whose numerics drifted in any pass.
    drift_ids: tuple[str, ...]
    positions: int
    max_abs_delta: float | None
    #: Ids answered on both sides in some pass where either side lacks logprobs.
    ids_without_logprobs: tuple[str, ...]

    def drift_ids_beyond(self, eps: float) -> tuple[str, ...]:
        """Ids with a drift larger than ``eps`` in some pass (``eps`` 0: any drift)."""
        return tuple(sorted({r.test_id for r in self.rows if r.max_abs_delta > eps}))


@dataclass(frozen=True)
class NumericEvidenceGate:
    """Whether the numerics can back a GREEN: logprobs at every position of every compared
    trial of every arm, not rounded."""

    ok: bool
    #: Arm -> trials answered but without logprobs at every position.
    missing: Mapping[str, int]
    #: Arms whose logprobs look rounded (every value at most :data:`ROUNDED_DECIMALS` decimals).
    rounded: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class RiskPoint:
    tokens: int
    #: Implied share of answers whose tokens change by this length: ``1 - (1 - p) ** tokens``.
    answer_change_share: float


@dataclass(frozen=True)
class RiskEstimate:
    """Divergence risk beyond the sample: an estimate, never a gate.

    A token flips where the drift of the top1-top2 margin exceeds the margin. The per-token
    flip probability is the chance that a drift drawn from the AC positions compared exceeds
    a margin drawn from A's positions (both empirical, assumed independent)."""

    a_positions: int
    drift_samples: int
    per_token_flip_probability: float | None
    curve: tuple[RiskPoint, ...]
    #: AC rows x passes whose tokens differed, and rows x passes compared (what was seen).
    observed_token_flips: int
    observed_rows: int
    basis: str


@dataclass(frozen=True)
class Numerics:
    """The cert's ``numerics`` block."""

    #: F4's threshold: drift larger than this counts (0: any bitwise difference).
    eps: float
    ac: PairNumerics
    ab: PairNumerics
    bc: PairNumerics
    #: A against its serial repeat A'; ``None`` when A' was not run.
    aa: PairNumerics | None
    evidence: NumericEvidenceGate
    risk: RiskEstimate
    #: What the numerics prove, in words: a GREEN's "bitwise equal at M positions ..." or why
    #: they prove nothing more.
    statement: str


def has_logprobs(t: Trial) -> bool:
    """Chosen logprob and margin at every generated token."""
    lps, margins, tokens = t.token_logprobs, t.top_margins, t.tokens
    if lps is None or margins is None or tokens is None:
        return False
    return len(lps) == len(tokens) == len(margins) and None not in margins


def _flip(x: Sequence[str], y: Sequence[str]) -> int | None:
    if x == y:
        return None
    for i, (a, b) in enumerate(zip(x, y, strict=False)):
        if a != b:
            return i
    return min(len(x), len(y))


@dataclass
class _Acc:
    """What one pair's comparison gathers beyond its record: the |delta margin| of every
    compared position that drifted, and the count of compared positions that did not."""

    margin_deltas: list[float]
    equal_positions: int = 0


def _compare_row(
    test_id: str, pass_index: int | None, x: Trial, y: Trial, acc: _Acc
) -> RowNumerics:
    """One id in one pass (kept in the record only when it drifted or flipped a token)."""
    xt, yt = x.tokens or (), y.tokens or ()
    flip = _flip(xt, yt)
    n = len(xt) if flip is None else flip
    xl, yl = x.token_logprobs or (), y.token_logprobs or ()
    xm, ym = x.top_margins or (), y.top_margins or ()
    if xl[:n] == yl[:n] and xm[:n] == ym[:n]:
        acc.equal_positions += n
        return RowNumerics(test_id, pass_index, n, None, 0.0, flip)
    first: int | None = None
    worst = 0.0
    for i in range(n):
        d_m = abs((xm[i] or 0.0) - (ym[i] or 0.0))
        if d_m:
            acc.margin_deltas.append(d_m)
        else:
            acc.equal_positions += 1
        d = max(abs(xl[i] - yl[i]), d_m)
        if d:
            first = i if first is None else first
            worst = max(worst, d)
    return RowNumerics(test_id, pass_index, n, first, worst, flip)


def _compare(
    pair: str,
    x: Mapping[str, Trial],
    ys: Sequence[tuple[int | None, Mapping[str, Trial]]],
    acc: _Acc,
) -> PairNumerics:
    per_pass: list[PassNumerics] = []
    all_rows: list[RowNumerics] = []
    drift: set[str] = set()
    no_logprobs: set[str] = set()
    for pass_index, y in ys:
        rows_compared = positions = missing = 0
        rows: list[RowNumerics] = []
        for test_id, yt in y.items():
            xt = x.get(test_id)
            if xt is None or xt.is_transport_failure or yt.is_transport_failure:
                continue
            if not (has_logprobs(xt) and has_logprobs(yt)):
                missing += 1
                no_logprobs.add(test_id)
                continue
            rows_compared += 1
            row = _compare_row(test_id, pass_index, xt, yt, acc)
            positions += row.positions
            if row.first_drift is not None or row.token_flip is not None:
                rows.append(row)
        drifted = [r for r in rows if r.first_drift is not None]
        drift.update(r.test_id for r in drifted)
        per_pass.append(
            PassNumerics(
                pass_index=pass_index,
                rows_compared=rows_compared,
                rows_without_logprobs=missing,
                positions=positions,
                rows_with_drift=len(drifted),
                rows_with_token_flip=sum(r.token_flip is not None for r in rows),
                first_drift_position=min(
                    (r.first_drift for r in drifted if r.first_drift is not None), default=None
                ),
                max_abs_delta=max((r.max_abs_delta for r in drifted), default=0.0)
                if rows_compared
                else None,
            )
        )
        all_rows.extend(rows)
    deltas = [p.max_abs_delta for p in per_pass if p.max_abs_delta is not None]
    all_rows.sort(key=lambda r: (r.test_id, -1 if r.pass_index is None else r.pass_index))
    return PairNumerics(
        pair=pair,
        per_pass=tuple(per_pass),
        rows=tuple(all_rows),
        drift_ids=tuple(sorted(drift)),
        positions=sum(p.positions for p in per_pass),
        max_abs_delta=max(deltas) if deltas else None,
        ids_without_logprobs=tuple(sorted(no_logprobs)),
    )


def compare_pair(
    pair: str,
    x: Mapping[str, Trial],
    ys: Sequence[tuple[int | None, Mapping[str, Trial]]],
) -> PairNumerics:
    """Compare ``x`` with each map of ``ys`` (``(pass_index, map)``) bitwise."""
    return _compare(pair, x, ys, _Acc([]))


def _rounded(trials: Iterable[Trial]) -> bool:
    """At least :data:`ROUNDED_MIN_VALUES` non-zero values, each with at most
    :data:`ROUNDED_DECIMALS` decimals. Stops at the first value that is not rounded (the
    first one, for an engine giving exact logprobs) instead of listing every value."""
    n = 0
    for t in trials:
        if t.token_logprobs is None:
            continue
        for v in (*t.token_logprobs, *(m for m in t.top_margins or () if m is not None)):
            if v:
                if round(v, ROUNDED_DECIMALS) != v:
                    return False
                n += 1
    return n >= ROUNDED_MIN_VALUES


def evidence_gate(arms: Mapping[str, Iterable[Trial]]) -> NumericEvidenceGate:
    """Every answered trial of every arm (``{arm: trials}``) must carry unrounded logprobs
    at every generated token."""
    missing: dict[str, int] = {}
    rounded: list[str] = []
    for arm, trials in arms.items():
        answered = [t for t in trials if not t.is_transport_failure]
        n = sum(not has_logprobs(t) for t in answered)
        if n:
            missing[arm] = n
        if _rounded(answered):
            rounded.append(arm)
    if not missing and not rounded:
        return NumericEvidenceGate(
            True, {}, (), "numeric evidence: every arm carries pre-sampling logprobs at every token"
        )
    said = []
    if missing:
        listed = ", ".join(f"{n} trial(s) of {arm}" for arm, n in missing.items())
        said.append(f"{listed} carry no pre-sampling logprobs at every token")
    if rounded:
        said.append(f"the logprobs of {', '.join(rounded)} look rounded")
    return NumericEvidenceGate(
        False,
        missing,
        tuple(rounded),
        f"numeric evidence missing: {'; '.join(said)}; the engine or endpoint gives no exact "
        "logprobs, so equal tokens cannot earn a promotable GREEN",
    )


def _risk_estimate(a: Iterable[Trial], ac: PairNumerics, acc: _Acc) -> RiskEstimate:
    """See :class:`RiskEstimate`; ``acc`` is what AC's comparison gathered."""
    margins = [m for t in a if has_logprobs(t) for m in t.top_margins or () if m is not None]
    deltas = sorted(acc.margin_deltas)
    n_d = len(deltas) + acc.equal_positions
    observed = sum(p.rows_with_token_flip for p in ac.per_pass)
    rows = sum(p.rows_compared for p in ac.per_pass)
    basis = (
        "share of (A margin, AC margin drift) pairs where the drift exceeds the margin, over "
        f"{len(margins)} A positions and {n_d} AC positions compared; an estimate, never a gate"
    )
    if not margins or not n_d:
        return RiskEstimate(len(margins), n_d, None, (), observed, rows, basis)
    exceed = sum(len(deltas) - bisect_right(deltas, m) for m in margins)
    p = exceed / (len(margins) * n_d)
    curve = tuple(RiskPoint(k, 1.0 - (1.0 - p) ** k) for k in RISK_LENGTHS)
    return RiskEstimate(len(margins), n_d, p, curve, observed, rows, basis)


def cell_numerics(
    a: Mapping[str, Trial],
    a_repeat: Mapping[str, Trial] | None,
    b: Mapping[str, Trial],
    passes: Sequence[tuple[int, Mapping[str, Trial]]],
    eps: float,
) -> Numerics:
    """The ``numerics`` block of one cell (its ``statement`` is the verdict's to write).
    Each pair compares the ids its second side holds, so when B ran on a RED cell's
    divergent ids only, AB and BC compare those alone."""
    acc = _Acc([])
    ac = _compare("AC", a, passes, acc)
    arms: dict[str, Iterable[Trial]] = {"A": a.values(), "B": b.values()}
    if a_repeat is not None:
        arms["A_repeat"] = a_repeat.values()
    for index, trials in passes:
        arms[f"C{index}"] = trials.values()
    return Numerics(
        eps=eps,
        ac=ac,
        ab=compare_pair("AB", a, [(None, b)]),
        bc=compare_pair("BC", b, passes),
        aa=None if a_repeat is None else compare_pair("AA", a, [(None, a_repeat)]),
        evidence=evidence_gate(arms),
        risk=_risk_estimate(a.values(), ac, acc),
        statement="",
    )


def drift_words(num: PairNumerics, ids: tuple[str, ...], n_rows: int) -> str:
    """``"r of P rows (max |delta| d; first drift at token f)"`` for the drifting ``ids``."""
    first = min(
        (r.first_drift for r in num.rows if r.test_id in ids and r.first_drift is not None),
        default=None,
    )
    at = f"; first drift at token {first}" if first is not None else ""
    return f"{len(ids)} of {n_rows} rows (max |delta| {num.max_abs_delta or 0.0:.3g}{at})"


def numeric_statement(
    numerics: Numerics, green: bool, n_prompts: int, n_cobatched: int, n_passes: int
) -> str:
    """What the numerics prove, in words (a GREEN's statement beside its bound)."""
    ac = numerics.ac
    equal = "bitwise equal" if numerics.eps == 0.0 else f"equal within eps {numerics.eps:g}"
    if not numerics.evidence.ok:
        return f"no numeric statement: {numerics.evidence.reason}"
    if green:
        return (
            f"tokens and logprobs {equal} at {ac.positions} positions over {n_prompts} "
            f"prompts x {n_passes} passes ({n_cobatched} co-batched)"
        )
    rows = max((p.rows_compared for p in ac.per_pass), default=0)
    if rows == 0:
        return "no AC logprobs compared: no id was answered in both A and a C pass"
    drift = ac.drift_ids_beyond(numerics.eps)
    if drift:
        return f"batching changed the numerics on {drift_words(ac, drift, rows)}"
    return f"AC logprobs {equal} at {ac.positions} positions over {n_passes} passes"
