"""The search's own rules (pure): which prompts probe a configuration, what a probe may say,
and the answer an operator reads off the table.

* A probe can only reject. Its cert is a small live cell (a few prompts that cross the
  engine's known drift boundary and reach the slot's end); a RED or AMBER there, or any drift
  it saw, rejects the configuration with that evidence. Anything else sends it on to a full
  cert: a probe that saw no drift is "not rejected", never GREEN (:func:`row_verdict`).
* :func:`probe_ids`: the prompts whose sequences are the shortest past each boundary, and the
  longest of the work-set (the slot's end).
* :func:`answer`: the fastest promotable GREEN (by its interleaved median against the defaults
  where every GREEN has one, else by its cert's concurrent tokens/s at N), else the
  best AMBER and the largest slot that held; and the positive control: the defaults must come
  out RED, or the cell is invariant at its defaults.
* :class:`Interleaved`: what a promotable GREEN buys against the defaults, measured in rounds
  that start one server at a time, the order turned each round (:func:`round_order`), read as
  the median of the rounds' ratios, so a host that slows down for a while cannot favour one.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "PROBE_PER_BOUNDARY",
    "Interleaved",
    "Measured",
    "Round",
    "SearchAnswer",
    "SearchRow",
    "answer",
    "probe_ids",
    "probe_per_boundary",
    "probe_rejects",
    "promotable_green",
    "round_order",
    "row_verdict",
    "vs_default",
]

#: Prompts a probe takes past each boundary (and at the slot's end).
PROBE_PER_BOUNDARY = 2
#: A probe's verdicts that reject: what it saw is drift, the same as a full cert would see.
REJECTING = frozenset({"RED", "AMBER"})


@dataclass(frozen=True)
class Measured:
    """One written cert as the search reads it (verified from its file)."""

    path: str
    valid: bool
    verdict: str
    promotable: bool
    slot_ctx: int | None
    longest: int | None
    first_drift_position: int | None
    bitwise_equal_up_to: int | None
    speedup: float | None
    concurrent_tokens_per_s: float | None
    #: Found in the out-dir for the same configuration and identity, not measured this run.
    reused: bool = False


@dataclass(frozen=True)
class Round:
    """One interleaved round: whether the configuration's server ran first, and each side's
    concurrent tokens/s (``None``: that side's batch lost a request or reported no tokens)."""

    config_first: bool
    config_tps: float | None
    defaults_tps: float | None

    @property
    def ratio(self) -> float | None:
        mine, theirs = self.config_tps, self.defaults_tps
        if mine is None or theirs is None or theirs <= 0:
            return None
        return round(mine / theirs, 3)


@dataclass(frozen=True)
class Interleaved:
    """A configuration's interleaved comparison with the defaults (same N, same prompts)."""

    rounds: tuple[Round, ...]
    #: Rounds asked for; fewer ran where the budget or a server stopped it (``stopped``).
    planned: int
    #: What it compared: both full certs' sha256 (a second run reuses it only for the same).
    key: str
    reused: bool = False
    stopped: str | None = None

    @property
    def median(self) -> float | None:
        """The median of the rounds' ratios, over the rounds where both sides measured."""
        ratios = [r.ratio for r in self.rounds if r.ratio is not None]
        return round(statistics.median(ratios), 3) if ratios else None

    @property
    def complete(self) -> bool:
        return self.stopped is None and len(self.rounds) == self.planned


def round_order(index: int) -> bool:
    """Whether the configuration's server runs first in round ``index``: the order turns every
    round, so neither side always follows the other (a warm cache, a host settling down)."""
    return index % 2 == 0


@dataclass(frozen=True)
class SearchRow:
    """One configuration of the search: its probe, its full cert, or why it was not run."""

    name: str
    words: str
    is_defaults: bool
    probe: Measured | None = None
    cert: Measured | None = None
    not_run: str | None = None
    #: The engine command that serves this configuration as its cert measured it (argv).
    deploy: tuple[str, ...] | None = None
    #: The folder of its certs (what ``serve --certs`` reads).
    certs: str | None = None
    #: Its interleaved comparison with the defaults (a promotable GREEN only).
    interleaved: Interleaved | None = None


def probe_rejects(probe: Measured | None) -> bool:
    """A valid probe cert rejects the configuration when it came out RED or AMBER, or when it
    saw a co-batched logprob leave the serial one (a first drift position) whatever its
    verdict: too small to be AMBER, it still shows the answers are not bitwise kept, so no
    full cert of it could be a promotable GREEN."""
    return (
        probe is not None
        and probe.valid
        and (probe.verdict in REJECTING or probe.first_drift_position is not None)
    )


def row_verdict(row: SearchRow) -> str:
    """The verdict the table shows: a full cert's, a rejecting probe's (marked as the
    probe's), or what was not measured. A probe never gives GREEN."""
    if row.cert is not None:
        return row.cert.verdict if row.cert.valid else "INVALID"
    if probe_rejects(row.probe):
        assert row.probe is not None
        verdict = row.probe.verdict
        return f"{verdict} (probe)" if verdict in REJECTING else "drift (probe)"
    if row.probe is not None:
        return "not certified (probe saw no drift)"
    return "not run"


def promotable_green(row: SearchRow) -> bool:
    cert = row.cert
    return cert is not None and cert.valid and cert.verdict == "GREEN" and cert.promotable


def vs_default(row: SearchRow, defaults: SearchRow | None) -> float | None:
    """This configuration's concurrent tokens/s at N over the defaults' (same N)."""
    mine = None if row.cert is None else row.cert.concurrent_tokens_per_s
    base = None if defaults is None or defaults.cert is None else defaults.cert
    theirs = None if base is None else base.concurrent_tokens_per_s
    if mine is None or theirs is None or theirs <= 0:
        return None
    return round(mine / theirs, 3)


def _evidence(row: SearchRow) -> Measured | None:
    return row.cert if row.cert is not None else row.probe


@dataclass(frozen=True)
class SearchAnswer:
    """What the table concludes."""

    fastest_green: str | None
    #: The defaults came out RED (``None``: their verdict is not known).
    control_red: bool | None
    best_amber: str | None
    #: The configuration whose sequences stayed bitwise equal longest, and how long.
    holds_longest: tuple[str, int] | None
    words: tuple[str, ...]


def _control(rows: Sequence[SearchRow]) -> tuple[bool | None, str]:
    defaults = next((r for r in rows if r.is_defaults), None)
    seen = None if defaults is None else _evidence(defaults)
    if seen is None or not seen.valid:
        return (
            None,
            "positive control: the defaults were not measured, so the search is not checked",
        )
    if seen.verdict == "RED":
        return True, "positive control: the defaults came out RED, as a co-batching cell should"
    return False, (
        f"positive control: the defaults came out {seen.verdict}, not RED: the cell is "
        "invariant at its defaults (no flag is needed to keep the answers)"
    )


def answer(rows: Sequence[SearchRow]) -> SearchAnswer:
    """The table's conclusion (see the module docstring)."""
    control, control_words = _control(rows)
    greens = [r for r in rows if promotable_green(r)]
    words: list[str] = []
    fastest = max(greens, key=_fastest_key(greens), default=None)
    ambers = [r for r in rows if r.cert is not None and r.cert.valid and r.cert.verdict == "AMBER"]
    best_amber = max(ambers, key=lambda r: _rate(r), default=None)
    held = [(r.name, e.bitwise_equal_up_to) for r in rows
            if (e := _evidence(r)) is not None and e.bitwise_equal_up_to is not None]  # fmt: skip
    holds = max(held, key=lambda h: h[1], default=None)
    if fastest is not None:
        words.append(f"fastest promotable GREEN: {fastest.name} ({fastest.words})")
    else:
        words.append("no configuration is promotable GREEN")
        if best_amber is not None:
            words.append(f"best AMBER: {best_amber.name} ({best_amber.words})")
        if holds is not None:
            words.append(
                f"longest bitwise-equal sequences: {holds[1]} tokens ({holds[0]}): a slot that "
                "size is the cell to measure next"
            )
    words.append(control_words)
    return SearchAnswer(
        fastest_green=None if fastest is None else fastest.name,
        control_red=control,
        best_amber=None if best_amber is None else best_amber.name,
        holds_longest=holds,
        words=tuple(words),
    )


def _median(row: SearchRow) -> float | None:
    return None if row.interleaved is None else row.interleaved.median


def _fastest_key(greens: Sequence[SearchRow]) -> Callable[[SearchRow], float]:
    """How the GREENs are ranked: by their interleaved medians where every one has one (each
    measured beside the defaults, so a host that drifted between them cannot reorder them),
    else by their certs' concurrent tokens/s."""
    if greens and all(_median(r) is not None for r in greens):
        return lambda r: _median(r) or 0.0
    return _rate


def _rate(row: SearchRow) -> float:
    cert = row.cert
    rate = None if cert is None else cert.concurrent_tokens_per_s
    return -1.0 if rate is None else rate


def probe_per_boundary(parallel: int, n_boundaries: int) -> int:
    """Prompts a probe takes past each boundary and at the slot's end: enough that one wave
    of N fills every slot (each prompt is co-batched with N - 1 others), at least
    :data:`PROBE_PER_BOUNDARY`."""
    return max(PROBE_PER_BOUNDARY, -(-parallel // (n_boundaries + 1)))


def probe_ids(
    sequences: Sequence[tuple[str, int]], boundaries: Sequence[int], per: int = PROBE_PER_BOUNDARY
) -> tuple[str, ...]:
    """The ids of the probe's prompts, from ``(id, sequence length)`` pairs: the ``per``
    shortest past each boundary, and the ``per`` longest (the slot's end); each once, in the
    work-set's order."""
    chosen: set[str] = set()
    for boundary in boundaries:
        past = sorted((s, i) for i, s in sequences if s > boundary)
        chosen.update(i for _, i in past[:per])
    longest = sorted(((s, i) for i, s in sequences), reverse=True)
    chosen.update(i for _, i in longest[:per])
    return tuple(i for i, _ in sequences if i in chosen)
