"""Across builds and engines: does the new server answer what the old one answered? (pure)

Two cells measured on two servers (two builds of llama-server, or two engines on one GGUF)
each carry their serial ground truth, arm A: per prompt the tokens, the pre-sampling logprobs
and the scored fields. When both cells ran the same model bytes, the same work-set content,
the same sampling settings and answer budget and the same scorer, their arms A answer the same
requests, and comparing them prompt by prompt says what the change of server did. Each prompt
is one :data:`PromptClass`, from best to worst:

* ``identical`` - tokens, scored fields and every logprob and margin bitwise equal;
* ``unchecked`` - tokens and scored fields equal, but a side carries no logprobs at every
  token, so drift could not be checked (never called identical);
* ``drift`` - tokens and scored fields equal, logprobs or margins differ (first drift
  position, max |delta|);
* ``tokens`` - the generated tokens changed, every scored field equal;
* ``scored`` - a scored (invariant) field changed: which, old and new value, the first
  divergent token and the margin there on each side;
* ``uncompared`` - a transport failure on either side: nothing to judge, never counted clean.

The rows come from the comparisons the cert itself uses (:func:`core.diff.diff_pair` for the
scored fields and tokens, :func:`core.numerics.compare_pair` for the logprobs), so there is
one comparison of token and logprob rows in the package. Anything that makes two cells not
comparable is a reason, and a cell with a reason compares nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from batch_invariance.core.diff import diff_pair
from batch_invariance.core.evidence import Trial
from batch_invariance.core.numerics import RowNumerics, compare_pair, has_logprobs
from batch_invariance.core.pair_report import DivergenceRow, Scalar

__all__ = [
    "CLASS_RANK",
    "COMPARE_VERSION",
    "FAIL_ON",
    "IGNORED_TEMPLATE_KEYS",
    "PROMPT_CLASSES",
    "CellComparison",
    "CellSide",
    "ClassCounts",
    "FailOn",
    "PromptChange",
    "PromptClass",
    "compare_cells",
    "fails_policy",
    "not_comparable",
    "worst_class",
]

#: Version of the comparison's JSON layout (docs/compare.md); bump on any change of keys.
COMPARE_VERSION = 2

PromptClass = Literal["identical", "unchecked", "drift", "tokens", "scored", "uncompared"]
PROMPT_CLASSES: tuple[PromptClass, ...] = (
    "identical",
    "unchecked",
    "drift",
    "tokens",
    "scored",
    "uncompared",
)
#: How bad each class is. ``unchecked`` ranks with ``drift``: without logprobs, drift cannot
#: be ruled out. ``uncompared`` ranks above ``tokens`` and below a scored change seen: its
#: answer is unknown, so it may hide one, and every policy but ``never`` fails on it
#: (:func:`fails_policy`).
CLASS_RANK: Mapping[str, int] = {
    "identical": 0,
    "unchecked": 1,
    "drift": 1,
    "tokens": 2,
    "uncompared": 3,
    "scored": 4,
}

#: What fails a job: the least class that does (``never``: nothing does).
FailOn = Literal["scored", "tokens", "drift", "never"]
FAIL_ON: tuple[FailOn, ...] = ("scored", "tokens", "drift", "never")

#: Request-template keys that do not change what the server computes: how long the client
#: waits, and which arms asked for logprobs (every arm does).
IGNORED_TEMPLATE_KEYS: frozenset[str] = frozenset({"timeout_s", "logprobs_by_arm"})


@dataclass(frozen=True)
class CellSide:
    """One cert's cell, as the comparison reads it (built from a verified cert)."""

    #: Where it came from (a file name), for messages.
    origin: str
    model: str
    ctx: int
    dispatch_n: int
    status: str
    verdict: str
    engine: str
    #: The server build: ``server_binary.sha256`` (``None`` when not recorded).
    build: str | None
    ts_utc: str
    model_sha256: str | None
    workset_sha256: str | None
    #: Each id of the work-set and its request key (``None`` when not recorded).
    request_keys: Mapping[str, str | None]
    #: The request template as recorded (endpoint, temperature, top_k, seed, budget, ...).
    template: Mapping[str, Any] | None
    scorer_id: str | None
    #: Arm A, the serial ground truth.
    a: Mapping[str, Trial]


@dataclass(frozen=True)
class PromptChange:
    """One prompt whose arm A is not bitwise identical across the two cells."""

    test_id: str
    prompt_class: PromptClass
    #: For ``scored``: the first differing scored field and every one that differs.
    field: str | None
    fields: tuple[str, ...]
    old: Scalar
    new: Scalar
    #: First differing token (``tokens``/``scored``, when both token streams are known).
    first_divergent_token: int | None
    old_margin: float | None
    new_margin: float | None
    #: First position whose logprob or margin differs, up to the first token difference.
    first_drift: int | None
    #: Largest |delta| of logprob or margin over the positions compared (0.0: equal).
    max_abs_delta: float | None
    old_excerpt: str | None
    new_excerpt: str | None
    #: Why a prompt is ``unchecked`` or ``uncompared``.
    reason: str | None = None


@dataclass(frozen=True)
class ClassCounts:
    identical: int = 0
    unchecked: int = 0
    drift: int = 0
    tokens: int = 0
    scored: int = 0
    uncompared: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, c) for c in PROMPT_CLASSES)


@dataclass(frozen=True)
class CellComparison:
    """Two cells side by side: their verdicts, and arm A prompt by prompt when comparable."""

    model: str
    ctx: int
    dispatch_n: int
    old_verdict: str
    new_verdict: str
    #: Why the two are not comparable; non-empty means nothing was compared.
    not_comparable: tuple[str, ...]
    counts: ClassCounts
    #: Every prompt that is not ``identical``, sorted by id.
    changes: tuple[PromptChange, ...]
    #: The worst class over the prompts compared; ``None`` when nothing was compared.
    worst: PromptClass | None

    @property
    def comparable(self) -> bool:
        return not self.not_comparable


def _template_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    keys = sorted((old.keys() | new.keys()) - IGNORED_TEMPLATE_KEYS - {"max_tokens"})
    return [k for k in keys if old.get(k, "(absent)") != new.get(k, "(absent)")]


def _show(value: Any) -> str:
    return "(not recorded)" if value is None else str(value)


def not_comparable(old: CellSide, new: CellSide) -> tuple[str, ...]:
    """Every reason the two cells' arms A do not answer the same requests (empty: they do).
    A fact either cert does not record is a reason too: what cannot be checked is never
    assumed equal."""
    why: list[str] = []
    if old.model_sha256 is None or new.model_sha256 is None:
        why.append("model file: a cert records no model sha256, so the model bytes are unknown")
    elif old.model_sha256 != new.model_sha256:
        why.append(
            f"another model file (sha256 {old.model_sha256[:12]}... vs {new.model_sha256[:12]}...)"
        )
    if old.workset_sha256 is None or new.workset_sha256 is None:
        why.append("work-set: a cert records no work-set sha256")
    elif old.workset_sha256 != new.workset_sha256:
        ws_old, ws_new = old.workset_sha256[:12], new.workset_sha256[:12]
        why.append(f"another work-set (sha256 {ws_old}... vs {ws_new}...)")
    if old.request_keys.keys() != new.request_keys.keys():
        only_old = sorted(old.request_keys.keys() - new.request_keys.keys())
        only_new = sorted(new.request_keys.keys() - old.request_keys.keys())
        named = ", ".join((only_old + only_new)[:3])
        why.append(
            f"other prompt ids ({len(only_old)} only in the baseline, {len(only_new)} only "
            f"in the new cert: {named})"
        )
    else:
        unknown = [k for k, v in old.request_keys.items() if None in (v, new.request_keys[k])]
        changed = [k for k, v in old.request_keys.items() if new.request_keys[k] != v]
        if unknown:
            why.append(f"request keys not recorded for {len(unknown)} prompt(s)")
        elif changed:
            why.append(
                f"the requests differ on {len(changed)} prompt(s) (first: {changed[0]}): "
                "another prompt text, endpoint or request body"
            )
    if old.template is None or new.template is None:
        why.append("sampling: a cert records no request template")
    else:
        budget_old, budget_new = old.template.get("max_tokens"), new.template.get("max_tokens")
        if budget_old is None or budget_old != budget_new:
            why.append(
                f"another answer budget (max_tokens {_show(budget_old)} vs {_show(budget_new)})"
            )
        differing = _template_differences(old.template, new.template)
        if differing:
            shown = ", ".join(
                f"{k} {old.template.get(k, '(absent)')!r} vs {new.template.get(k, '(absent)')!r}"
                for k in differing[:3]
            )
            why.append(f"other sampling settings ({shown})")
    if old.scorer_id is None or new.scorer_id is None:
        why.append("scorer: a cert records no scorer id, so scored fields may mean other things")
    elif old.scorer_id != new.scorer_id:
        why.append(f"another scorer ({old.scorer_id} vs {new.scorer_id})")
    if old.ctx != new.ctx:
        why.append(f"another context size (ctx {old.ctx} vs {new.ctx})")
    return tuple(why)


def _change_from_row(row: DivergenceRow, cls: PromptClass) -> PromptChange:
    return PromptChange(
        test_id=row.test_id,
        prompt_class=cls,
        field=row.field if cls == "scored" else None,
        fields=row.fields,
        old=row.x if cls == "scored" else None,
        new=row.y if cls == "scored" else None,
        first_divergent_token=row.first_divergent_token,
        old_margin=row.x_top_margin,
        new_margin=row.y_top_margin,
        first_drift=None,
        max_abs_delta=None,
        old_excerpt=row.x_excerpt,
        new_excerpt=row.y_excerpt,
    )


def _with_numerics(change: PromptChange, num: RowNumerics | None) -> PromptChange:
    if num is None:
        return change
    return replace(change, first_drift=num.first_drift, max_abs_delta=num.max_abs_delta)


def _bare(test_id: str, cls: PromptClass, reason: str | None = None) -> PromptChange:
    return PromptChange(
        test_id, cls, None, (), None, None, None, None, None, None, None, None, None, reason
    )


def _classify(old: Mapping[str, Trial], new: Mapping[str, Trial]) -> tuple[PromptChange, ...]:
    """Every prompt of the two arms A that is not identical (both hold the same ids)."""
    report = diff_pair("AA", old, new)
    numerics = {r.test_id: r for r in compare_pair("AA", old, [(None, new)]).rows}
    changes: dict[str, PromptChange] = {}
    for row in report.per_id:
        cls: PromptClass = "scored" if row.kind == "invariant" else "tokens"
        changes[row.test_id] = _with_numerics(_change_from_row(row, cls), numerics.get(row.test_id))
    for test_id in report.transport_skipped_ids:
        side = "baseline" if old[test_id].is_transport_failure else "new cert"
        changes[test_id] = _bare(
            test_id, "uncompared", f"transport failure in the {side}'s arm A: no answer to judge"
        )
    for test_id, num in numerics.items():
        if test_id not in changes and num.first_drift is not None:
            changes[test_id] = PromptChange(
                test_id, "drift", None, (), None, None, None, None, None,
                num.first_drift, num.max_abs_delta, None, None,
            )  # fmt: skip
    for test_id, x in old.items():
        if test_id in changes or test_id in numerics:
            continue
        y = new[test_id]
        if not (has_logprobs(x) and has_logprobs(y)):
            side = "baseline" if not has_logprobs(x) else "new cert"
            changes[test_id] = _bare(
                test_id,
                "unchecked",
                f"the {side} carries no logprobs at every token: drift not checked",
            )
    return tuple(changes[k] for k in sorted(changes))


def _counts(n_prompts: int, changes: Sequence[PromptChange]) -> ClassCounts:
    tally = {c: 0 for c in PROMPT_CLASSES}
    for change in changes:
        tally[change.prompt_class] += 1
    tally["identical"] = n_prompts - len(changes)
    return ClassCounts(**tally)


def worst_class(counts: ClassCounts) -> PromptClass | None:
    """The worst ranked class present (``None``: no prompt)."""
    present: list[PromptClass] = [c for c in PROMPT_CLASSES if getattr(counts, c)]
    if not present:
        return None
    return max(present, key=CLASS_RANK.__getitem__)


def compare_cells(old: CellSide, new: CellSide) -> CellComparison:
    """The comparison of two cells: refused with its reasons, or arm A prompt by prompt."""
    why = not_comparable(old, new)
    changes: tuple[PromptChange, ...] = () if why else _classify(old.a, new.a)
    counts = ClassCounts() if why else _counts(len(old.a), changes)
    return CellComparison(
        model=new.model,
        ctx=new.ctx,
        dispatch_n=new.dispatch_n,
        old_verdict=old.verdict,
        new_verdict=new.verdict,
        not_comparable=why,
        counts=counts,
        changes=changes,
        worst=None if why else worst_class(counts),
    )


def fails_policy(cells: Sequence[CellComparison], fail_on: FailOn) -> tuple[str, ...]:
    """Why the comparison fails a job under ``fail_on`` (empty: it passes). A cell not
    comparable, or a prompt with no answer to judge, fails every policy but ``never``: what
    could not be compared is never taken as unchanged."""
    if fail_on == "never":
        return ()
    threshold = CLASS_RANK[fail_on]
    why: list[str] = []
    if not cells:
        why.append("no cell of the baseline matches a cell of the new certs")
    for cell in cells:
        name = f"{cell.model} ctx {cell.ctx} N {cell.dispatch_n}"
        if cell.not_comparable:
            why.append(f"{name}: not comparable ({cell.not_comparable[0]})")
            continue
        failing = [
            c
            for c in PROMPT_CLASSES
            if c != "uncompared" and getattr(cell.counts, c) and CLASS_RANK[c] >= threshold
        ]
        failing.sort(key=lambda c: -CLASS_RANK[c])
        for c in failing:
            why.append(f"{name}: {getattr(cell.counts, c)} prompt(s) {c}")
        if cell.counts.uncompared:
            why.append(f"{name}: {cell.counts.uncompared} prompt(s) could not be compared")
    return tuple(why)
