"""Per divergent id: the A and C answers split at the first divergent token, the passes it
diverged in, and whether the flip was a near tie. Pure, from ``divergence_report.ac.per_id``
and the trials in ``evidence``.

For a one-line view (the job summary's table) :func:`ac_excerpts` gives the two answers of a
row as windows that open a little before the first character where they differ, so the two
cells show the difference (answers that agree on their first 80 characters would otherwise
read the same)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batch_invariance.cert.schema import Cert, TrialRecord
from batch_invariance.core.pair_report import DivergenceRow
from batch_invariance.report.escape import md_cell, md_code
from batch_invariance.report.fields import dig, integer, num

#: A flip whose top-1 minus top-2 logprob margin (on either side) is below this many nats is
#: a near-tie: a tiny numerical change in the batched kernels is enough to swap the argmax.
TIE_FLIP_MARGIN = 0.1

#: Characters of context kept on each side of the first divergent token in the text views.
CONTEXT_CHARS = 240

#: A one-line answer window: this many characters, opening :data:`WINDOW_LEAD` characters
#: before the first difference (with a ``…`` at a cut end it stays within a summary cell's 80).
WINDOW_CHARS = 76
WINDOW_LEAD = 16
#: Rows of the job summary's table of divergent ids.
MAX_DIVERGENT_ROWS = 10


@dataclass(frozen=True)
class TextSide:
    """One side of a divergent answer split at the first divergent token.

    ``token`` is ``None`` when tokens were not recorded (then ``before`` holds the excerpt).
    """

    before: str
    token: str | None
    after: str
    margin: float | None


@dataclass(frozen=True)
class DivergentId:
    test_id: str
    kind: str
    field: str
    passes: tuple[int, ...]
    shown_pass: int | None
    first_token: int | None
    a: TextSide
    c: TextSide
    flip: str


def _trial(data: Mapping[str, Any], arm: str, pass_index: int | None) -> Mapping[str, Any] | None:
    evidence = data.get("evidence")
    if not isinstance(evidence, Mapping):
        return None
    if arm == "a":
        found = evidence.get("a")
        return found if isinstance(found, Mapping) else None
    for record in evidence.get("c_passes") or ():
        if isinstance(record, Mapping) and record.get("index") == pass_index:
            trials = record.get("trials")
            return trials if isinstance(trials, Mapping) else None
    return None


def _clip_left(text: str) -> str:
    return text if len(text) <= CONTEXT_CHARS else "…" + text[-CONTEXT_CHARS:]


def _clip_right(text: str) -> str:
    return text if len(text) <= CONTEXT_CHARS else text[:CONTEXT_CHARS] + "…"


def _side(
    trial: Mapping[str, Any] | None, position: int | None, margin: Any, fallback: Any
) -> TextSide:
    """Split a trial's recorded tokens at ``position``; without tokens show the excerpt."""
    shown_margin = num(margin)
    tokens = trial.get("tokens") if isinstance(trial, Mapping) else None
    if trial is None:
        return TextSide("(no answer in this arm)", None, "", shown_margin)
    if (
        position is None
        or not isinstance(tokens, list)
        or not all(isinstance(t, str) for t in tokens)
    ):
        text = trial.get("completion_excerpt")
        if not isinstance(text, str):
            text = fallback if isinstance(fallback, str) else ""
        return TextSide(_clip_right(text), None, "", shown_margin)
    if shown_margin is None:
        margins = trial.get("top_margins")
        if isinstance(margins, list) and position < len(margins):
            shown_margin = num(margins[position])
    before = "".join(tokens[:position])
    token = tokens[position] if position < len(tokens) else ""
    after = "".join(tokens[position + 1 :])
    return TextSide(_clip_left(before), token, _clip_right(after), shown_margin)


def flip_kind(a_margin: float | None, c_margin: float | None) -> str:
    """``tie flip`` when either recorded margin is below :data:`TIE_FLIP_MARGIN`."""
    known = [m for m in (a_margin, c_margin) if m is not None]
    if not known:
        return "margin not recorded"
    smallest = min(known)
    if smallest < TIE_FLIP_MARGIN:
        return f"tie flip (top1-top2 margin {smallest:.3g} < {TIE_FLIP_MARGIN})"
    return f"confident flip (top1-top2 margin {smallest:.3g} >= {TIE_FLIP_MARGIN})"


def divergent_ids(data: Mapping[str, Any]) -> tuple[DivergentId, ...]:
    """One entry per id that differed between A and C, shown at its first divergent pass."""
    ac = dig(data, "divergence_report", "AC")
    if not isinstance(ac, Mapping):
        return ()
    rows = [r for r in ac.get("per_id") or () if isinstance(r, Mapping)]
    by_id: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        test_id = row.get("test_id")
        if isinstance(test_id, str):
            by_id.setdefault(test_id, []).append(row)
    out = []
    for test_id in sorted(by_id):
        id_rows = by_id[test_id]
        # Invariant differences first: an id that also had token-only passes is divergent.
        ranked = sorted(
            id_rows,
            key=lambda r: (r.get("kind") == "token_only", integer(r.get("pass_index")) or 0),
        )
        first = ranked[0]
        kind = str(first.get("kind"))
        passes = tuple(
            sorted(
                {
                    p
                    for r in id_rows
                    if (p := integer(r.get("pass_index"))) is not None
                    and (kind == "token_only" or r.get("kind") != "token_only")
                }
            )
        )
        shown_pass = integer(first.get("pass_index"))
        position = integer(first.get("first_divergent_token"))
        a_trials = _trial(data, "a", None)
        c_trials = _trial(data, "c", shown_pass)
        a_side = _side(
            a_trials.get(test_id) if a_trials else None,
            position,
            first.get("x_top_margin"),
            first.get("x_excerpt"),
        )
        c_side = _side(
            c_trials.get(test_id) if c_trials else None,
            position,
            first.get("y_top_margin"),
            first.get("y_excerpt"),
        )
        out.append(
            DivergentId(
                test_id=test_id,
                kind=kind,
                field=str(first.get("field")),
                passes=passes,
                shown_pass=shown_pass,
                first_token=position,
                a=a_side,
                c=c_side,
                flip=flip_kind(a_side.margin, c_side.margin),
            )
        )
    return tuple(out)


def shown_text(text: str) -> str:
    """An answer on one line as a table cell shows it: line breaks and tabs written ``\\n``,
    ``\\r``, ``\\t`` (so a difference in them shows), runs of spaces as one space."""
    escaped = text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
    return " ".join(escaped.split())


def first_difference(a: str, c: str) -> int | None:
    """The index of the first character where ``a`` and ``c`` differ (the shorter one's
    length when it is a prefix of the other); ``None`` when they are equal."""
    if a == c:
        return None
    pairs = enumerate(zip(a, c, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(c)))


def _window(text: str, start: int, width: int) -> str:
    body = text[start : start + width]
    return ("…" if start else "") + body + ("…" if start + width < len(text) else "")


def answer_windows(
    a: str, c: str, width: int = WINDOW_CHARS, lead: int = WINDOW_LEAD
) -> tuple[str, str]:
    """The two answers (:func:`shown_text`), each cut to ``width`` characters from ``lead``
    characters before their first difference, ``…`` marking a cut end; answers that show
    the same are cut from their start."""
    a_shown, c_shown = shown_text(a), shown_text(c)
    at = first_difference(a_shown, c_shown)
    start = 0 if at is None else max(0, at - lead)
    return _window(a_shown, start, width), _window(c_shown, start, width)


def _answer(trial: TrialRecord | None, recorded: str) -> str | None:
    """The whole answer, from its tokens joined, where they are recorded and begin with its
    recorded excerpt (``None``: only the excerpt is known)."""
    if trial is None or trial.tokens is None:
        return None
    joined = "".join(trial.tokens)
    return joined if joined.startswith(recorded) else None


def ac_excerpts(cert: Cert, row: DivergenceRow) -> tuple[object, object]:
    """What an A-vs-C row shows for A and for C: windows around the first difference of the
    two answers (:func:`answer_windows`; the whole answers where both sides' tokens are
    recorded, else the excerpts, their first 80 characters), or the differing values where
    an answer is not recorded (a missing id, a failed request)."""
    if row.x_excerpt is None or row.y_excerpt is None:
        return (
            row.x_excerpt if row.x_excerpt is not None else row.x,
            row.y_excerpt if row.y_excerpt is not None else row.y,
        )
    evidence = cert.evidence
    c_trials = next((p.trials for p in evidence.c_passes if p.index == row.pass_index), {})
    a_text = _answer(evidence.a.get(row.test_id), row.x_excerpt)
    c_text = _answer(c_trials.get(row.test_id), row.y_excerpt)
    if a_text is None or c_text is None:
        return answer_windows(row.x_excerpt, row.y_excerpt)
    return answer_windows(a_text, c_text)


def divergent_ids_markdown(cert: Cert) -> list[str]:
    """The job summary's table of A-vs-C divergent ids (at most ``MAX_DIVERGENT_ROWS``), each
    answer shown from just before where A and C first differ, and the count of ids that
    differ in their tokens only."""
    ac = cert.divergence_report.ac
    lines: list[str] = []
    rows = [row for row in ac.per_id if row.kind != "token_only"]
    if rows:
        lines += ["| id | pass | field | A | C |", "| --- | --- | --- | --- | --- |"]
        for row in rows[:MAX_DIVERGENT_ROWS]:
            a_text, c_text = ac_excerpts(cert, row)
            where = "" if row.pass_index is None else str(row.pass_index)
            test_id = md_code(row.test_id, 60, table=True)
            lines.append(
                f"| `{test_id}` | {where} | {md_cell(row.field, 60)} | {md_cell(a_text)} | "
                f"{md_cell(c_text)} |"
            )
        if len(rows) > MAX_DIVERGENT_ROWS:
            lines.append(f"\n…and {len(rows) - MAX_DIVERGENT_ROWS} more rows in the cert.")
    else:
        lines.append("None: A and C agreed on every compared id and pass.")
    if ac.token_divergence_ids:
        lines.append(
            f"\nToken-only differences (same invariant fields): {len(ac.token_divergence_ids)} "
            "id(s)."
        )
    return lines
