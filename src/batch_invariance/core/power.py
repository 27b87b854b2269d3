"""Detection power of a schedule (pure): how likely a schedule is to observe a cell whose
co-batching changes a share ``p`` of answers, or drifts the logprobs of a share ``q`` of rows.

**The schedule.** ``P`` distinct prompts, each sent ``R`` times per pass (repetitions, ids
``#rK``), in ``K`` concurrent passes C at ``N`` slots: every prompt has ``m = R x K``
co-batched runs, ``P x R x K`` in all. Arm A (serial) answers each request once: the
reference. A run *observes a change* when its scored answer differs from A's (for drift: when
its row, one request's pre-sampling logprobs, differs from A's bitwise). B and A' are serial:
they tell slot allocation and run-to-run noise apart and observe nothing about co-batching.

**The model.** Each distinct prompt, independently of the others, is *susceptible* with
probability ``s``: co-batching can change it. Each co-batched run of a susceptible prompt then
changes on its own with probability ``f`` (the *flip*); a prompt that is not susceptible never
changes. So no run observes anything with probability ::

    miss = (1 - s + s (1 - f) ** m) ** P        power = 1 - miss

Every model is asked at ``p``, the share of co-batched runs whose answer changes (the issue's
"a cell that changes 1 answer in 100"), so ``s x f = p``. Two cases are named (:class:`Model`):

* **per prompt** (:data:`PER_PROMPT`: ``s = p``, ``f = 1``): every run of one prompt is one
  draw. Deterministic kernels give the same result for the same batch, and a prompt sitting
  near a tie changes whatever its partners: ``power = 1 - (1 - p) ** P``, whatever ``R`` and
  ``K``. At a given ``p`` this is the worst case of *any* correlation between the runs of a
  prompt (no change in ``m`` runs implies no change in the first, which has probability
  ``1 - p``), so it is what a GREEN can promise. The rule-of-three bound ``3 / P`` of a GREEN
  is about this model's smallest ``p`` caught with probability 0.95 (``1 - 0.05 ** (1 / P)``).
* **per run** (:data:`PER_RUN`: ``s = 1``, ``f = p``): each co-batched run changes
  independently: ``power = 1 - (1 - p) ** (P x R x K)``, the best case of every latent model at
  that ``p`` (``(1 - p) ** m <= 1 - s + s (1 - f) ** m`` by convexity). Issue 42's probe of
  raw completions (6-9 of 16 prompts changed per pass, not the same ones from pass to pass)
  leans this way.

:func:`latent` gives the cases between (a flip ``f`` below 1, ``s = p / f``): the chat and
ladder cells of docs/numerics.md, where mostly the same prompts changed in every pass, lie
there.

``p`` is the share at the cell's own ``N``: the formula has no other ``N`` in it, and a power
stated at one ``N`` says nothing about another. Drift is the same count over rows
(:func:`drift_power`): only what a run must show differs. Runs that were not co-batched
observe nothing: a cert's own power counts its co-batched runs (:func:`sample_power`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "PER_PROMPT",
    "PER_RUN",
    "RATES",
    "TARGET",
    "Model",
    "Schedule",
    "drift_power",
    "latent",
    "min_detectable",
    "miss_probability",
    "power",
    "power_table",
    "power_text",
    "power_words",
    "sample_miss",
    "sample_power",
]

#: The shares every view states the power at: 1, 3 and 10 answers in 100.
RATES = (0.01, 0.03, 0.10)
#: The power :func:`min_detectable` solves for.
TARGET = 0.95
_BISECT_ITER = 200


@dataclass(frozen=True)
class Schedule:
    """``prompts`` distinct prompts x ``reps`` repetitions x ``passes`` C passes at
    ``parallel`` slots."""

    prompts: int
    reps: int = 1
    passes: int = 1
    parallel: int = 4

    def __post_init__(self) -> None:
        if min(self.prompts, self.reps, self.passes) < 1 or self.parallel < 2:
            raise ValueError(f"not a schedule: {self}")

    @property
    def runs_per_prompt(self) -> int:
        """``R x K``: the co-batched runs of one prompt."""
        return self.reps * self.passes

    @property
    def runs(self) -> int:
        """``P x R x K``: the co-batched runs, the C requests."""
        return self.prompts * self.runs_per_prompt


@dataclass(frozen=True)
class Model:
    """How the runs of one prompt are correlated: ``flip`` is the chance that a run of a
    susceptible prompt changes (``None``: every prompt is susceptible and each run changes
    at the rate). A model is always asked at a share of changed runs."""

    name: str
    flip: float | None

    def __post_init__(self) -> None:
        if self.flip is not None and not 0.0 < self.flip <= 1.0:
            raise ValueError(f"flip must be in (0, 1], got {self.flip}")

    @property
    def max_rate(self) -> float:
        """The largest share of changed runs the model can give (every prompt susceptible)."""
        return 1.0 if self.flip is None else self.flip

    def draw(self, rate: float) -> tuple[float, float]:
        """``(s, f)`` for a share ``rate`` of changed runs: ``s x f = rate``."""
        _check_rate(rate)
        if self.flip is None:
            return 1.0, rate
        if rate > self.flip:
            raise ValueError(f"a flip of {self.flip:g} changes at most that share, not {rate:g}")
        return rate / self.flip, self.flip


PER_PROMPT = Model("per prompt", 1.0)
PER_RUN = Model("per run", None)


def latent(flip: float) -> Model:
    """The model between: a share ``rate / flip`` of prompts is susceptible and each run of
    one changes with probability ``flip``."""
    return Model(f"flip {flip:g}", flip)


def _check_rate(rate: float) -> None:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"a rate is in [0, 1], got {rate}")


def miss_probability(
    prompts: int, runs_per_prompt: float, susceptible: float, flip: float
) -> float:
    """``(1 - s + s (1 - f) ** m) ** P``: no run of any prompt changes. ``runs_per_prompt``
    may be an average (a cert's co-batched runs over its prompts): exact for both named
    models, whose miss depends on ``P`` alone or on ``P x m`` alone."""
    _check_rate(susceptible)
    _check_rate(flip)
    if prompts < 1 or runs_per_prompt <= 0:
        raise ValueError(f"need prompts >= 1 and runs > 0, got {prompts}, {runs_per_prompt}")
    per_prompt = 1.0 - susceptible + susceptible * (1.0 - flip) ** runs_per_prompt
    return float(per_prompt**prompts)


def sample_miss(prompts: int, runs: int, rate: float, model: Model = PER_PROMPT) -> float:
    """The chance that ``runs`` co-batched runs over ``prompts`` distinct prompts observe
    nothing of a cell that changes a share ``rate`` (answers or rows) under ``model``."""
    s, f = model.draw(rate)
    return miss_probability(prompts, runs / prompts, s, f)


def sample_power(prompts: int, runs: int, rate: float, model: Model = PER_PROMPT) -> float:
    """The chance that ``runs`` co-batched runs over ``prompts`` distinct prompts observe a
    cell that changes a share ``rate`` (answers or rows) under ``model``."""
    return 1.0 - sample_miss(prompts, runs, rate, model)


def power(schedule: Schedule, rate: float, model: Model = PER_PROMPT) -> float:
    """The chance that ``schedule`` observes a changed answer in a cell whose co-batching
    changes a share ``rate`` of answers (``p``)."""
    return sample_power(schedule.prompts, schedule.runs, rate, model)


def drift_power(schedule: Schedule, rate: float, model: Model = PER_PROMPT) -> float:
    """The chance that ``schedule`` observes a drifting row (logprobs compared bitwise) in a
    cell whose co-batching drifts a share ``rate`` of rows (``q``): the count of
    :func:`power`, over rows instead of answers."""
    return sample_power(schedule.prompts, schedule.runs, rate, model)


def min_detectable(
    schedule: Schedule, model: Model = PER_PROMPT, target: float = TARGET
) -> float | None:
    """The smallest share (of answers, or of drifting rows) caught with probability at least
    ``target`` (bisection; power grows with the share); ``None`` when even the largest share
    the model gives is not."""
    if not 0.0 < target < 1.0:
        raise ValueError(f"target must be in (0, 1), got {target}")
    lo, hi = 0.0, model.max_rate
    if power(schedule, hi, model) < target:
        return None
    for _ in range(_BISECT_ITER):
        mid = (lo + hi) / 2.0
        if power(schedule, mid, model) >= target:
            hi = mid
        else:
            lo = mid
        if hi - lo < 1e-12:
            break
    return hi


def power_text(miss: float) -> str:
    """The power ``1 - miss`` in two decimals, never rounded to a certainty it is not:
    ``0.28``, ``>0.99`` (``1.00`` only when ``miss`` is 0), ``<0.01``."""
    value = 1.0 - miss
    text = f"{value:.2f}"
    if text == "1.00" and miss > 0.0:
        return ">0.99"
    if text == "0.00" and value > 0.0:
        return "<0.01"
    return text


def _figures(prompts: int, runs: int, model: Model) -> tuple[str, ...]:
    return tuple(
        power_text(sample_miss(prompts, runs, r, model)) if r <= model.max_rate else "-"
        for r in RATES
    )


def power_words(prompts: int, runs: int) -> str:
    """What ``runs`` co-batched runs over ``prompts`` distinct prompts catch, at
    :data:`RATES`, under both named models: ``32 distinct prompts and 64 co-batched runs catch
    a cell that changes 1 answer (or drifts 1 row) in 100 with probability 0.28 (3 in 100:
    0.62; 10 in 100: 0.97) if a prompt's runs change together, 0.47 (0.86; >0.99) if each run
    changes on its own``."""
    in_100 = [f"{round(r * 100):g}" for r in RATES]
    together = _figures(prompts, runs, PER_PROMPT)
    alone = _figures(prompts, runs, PER_RUN)
    more = "; ".join(f"{n} in 100: {t}" for n, t in zip(in_100[1:], together[1:], strict=True))
    return (
        f"{prompts} distinct prompts and {runs} co-batched runs catch a cell that changes "
        f"{in_100[0]} answer (or drifts {in_100[0]} row) in 100 with probability "
        f"{together[0]} ({more}) if a prompt's runs change together, {alone[0]} "
        f"({'; '.join(alone[1:])}) if each run changes on its own"
    )


def _smallest(schedule: Schedule, model: Model) -> str:
    share = min_detectable(schedule, model)
    return "-" if share is None else f"{share:.3g}"


def power_table(
    rows: Sequence[tuple[str, Schedule]], models: Sequence[Model] = (PER_PROMPT, PER_RUN)
) -> list[str]:
    """A Markdown table of each named schedule's power at :data:`RATES` under each model,
    and the smallest share each catches with probability :data:`TARGET`."""
    heads = " | ".join(f"{m.name}, p = {r:g}" for m in models for r in RATES)
    names = " / ".join(m.name for m in models)
    lines = [
        f"| schedule | C requests | {heads} | p caught with {TARGET:g}: {names} |",
        "|---|---|" + "---|" * (len(models) * len(RATES) + 1),
    ]
    for name, schedule in rows:
        cells = [_figures(schedule.prompts, schedule.runs, m) for m in models]
        figures = " | ".join(" | ".join(c) for c in cells)
        smallest = " / ".join(_smallest(schedule, m) for m in models)
        lines.append(f"| {name} | {schedule.runs} | {figures} | {smallest} |")
    return lines
