"""Scoring one response into a :class:`~batch_invariance.core.evidence.Trial` (a transport
failure stays a failure mode; an id with no response is recorded, never left out)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from batch_invariance.core.evidence import Trial
from batch_invariance.core.scoring import Completion, Scorer, evaluate
from batch_invariance.core.workitem import WorkItem
from batch_invariance.run.response import RawResponse


def content_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class Notes:
    items: list[str] = field(default_factory=list)

    def add(self, note: str) -> None:
        self.items.append(note)


def describe_attempt(resp: RawResponse) -> str:
    """A failed attempt in one line: ``"failure_mode: detail"``."""
    return f"{resp.failure_mode}: {resp.transport_error or 'no detail'}"


def make_trial(
    resp: RawResponse,
    item: WorkItem,
    scorer: Scorer,
    n_predict: int,
    notes: Notes,
    arm: str,
    first_attempt: RawResponse | None = None,
) -> Trial:
    """Score one response into a trial (a transport failure stays a failure mode);
    ``first_attempt`` is the failed try before it, when the request was retried."""
    for note in resp.notes:
        notes.add(f"{arm}: {note}")
    retried = None if first_attempt is None else describe_attempt(first_attempt)
    if retried is not None:
        notes.add(f"{arm}: {item.test_id}: retried once after {retried}")
    timings = dict(resp.timings or {})
    if resp.failure_mode is not None or resp.text is None:
        return Trial(
            test_id=item.test_id,
            score=None,
            passed=None,
            extracted_answer=None,
            expected_answer=item.expected_answer,
            prompt_tokens_measured=None,
            failure_mode=resp.failure_mode or "connection_error",
            dispatch_ts=resp.dispatch_ts,
            complete_ts=resp.complete_ts,
            timings=timings,
            transport_error=resp.transport_error,
            first_attempt=retried,
        )
    completion = Completion(
        text=resp.text,
        finish_reason=resp.finish_reason,
        completion_tokens=resp.completion_tokens,
        n_predict=n_predict,
    )
    result = evaluate(scorer, item, completion)
    if result.error is not None:
        notes.add(f"{arm}: {item.test_id}: scorer raised {result.error}")
    return Trial(
        test_id=item.test_id,
        score=result.score,
        passed=result.passed,
        extracted_answer=result.extracted_answer,
        expected_answer=item.expected_answer,
        prompt_tokens_measured=resp.prompt_tokens,
        failure_mode=result.failure_mode,
        completion=resp.text,
        content_sha256=content_sha256(resp.text),
        completion_tokens=resp.completion_tokens,
        finish_reason=resp.finish_reason,
        tokens=resp.tokens,
        token_logprobs=resp.token_logprobs,
        top_margins=resp.top_margins,
        dispatch_ts=resp.dispatch_ts,
        complete_ts=resp.complete_ts,
        slot_id=resp.slot_id,
        timings=timings,
        transport_error=None,
        first_attempt=retried,
    )


def trials_for(
    responses: Mapping[str, RawResponse],
    items: Sequence[WorkItem],
    scorer: Scorer,
    n_predict: int,
    notes: Notes,
    arm: str,
    first_attempts: Mapping[str, RawResponse] | None = None,
) -> dict[str, Trial]:
    """One trial per item, in item order (``first_attempts``: the retried requests' failed
    first tries, by id)."""
    retried = first_attempts or {}
    out: dict[str, Trial] = {}
    for item in items:
        resp = responses.get(item.test_id)
        if resp is None:
            # Never leave an id out (an absent id reads as a divergence): record why instead.
            notes.add(f"{arm}: {item.test_id}: no response recorded")
            resp = RawResponse(
                item.test_id, "connection_error", transport_error="no response recorded"
            )
        first = retried.get(item.test_id)
        out[item.test_id] = make_trial(resp, item, scorer, n_predict, notes, arm, first)
    return out
