"""Scoring one response into a :class:`~batch_invariance.core.evidence.Trial` (a transport
failure stays a failure mode; an id with no response is recorded, never left out).

What came back from one request: :class:`RawResponse`, parsed from a completion body.

:func:`parse_completion` reads the OpenAI chat/completions shapes (and llama-server's native
``/completion`` shape) into a :class:`RawResponse`; :func:`parse_logprobs` reads the generated
tokens with their logprobs and top-1 minus top-2 margins. A body that does not look like a
completion is a value (``http_error``), never an exception.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batch_invariance.core.evidence import FINISH_LENGTH, FINISH_STOP, Trial
from batch_invariance.core.plan import WorkItem
from batch_invariance.core.scoring import Completion, Scorer, evaluate
from batch_invariance.engines.probes import as_int


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


@dataclass(frozen=True)
class RawResponse:
    """One request's outcome as the transport saw it, before scoring.

    ``failure_mode`` is ``None`` when a completion came back; otherwise one of
    :data:`~batch_invariance.core.evidence.TRANSPORT_MODES` and ``text`` is ``None``.
    """

    test_id: str
    failure_mode: str | None
    text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    timings: Mapping[str, float] | None = None
    slot_id: int | None = None
    tokens: tuple[str, ...] | None = None
    token_logprobs: tuple[float, ...] | None = None
    top_margins: tuple[float | None, ...] | None = None
    dispatch_ts: float | None = None
    complete_ts: float | None = None
    http_status: int | None = None
    transport_error: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.failure_mode is None


@dataclass(frozen=True)
class TokenLogprobs:
    """Generated tokens with their chosen logprob and top-1 minus top-2 margin."""

    tokens: tuple[str, ...]
    #: ``None`` when the server left any position without a finite logprob.
    logprobs: tuple[float, ...] | None
    margins: tuple[float | None, ...]


def as_float(value: Any) -> float | None:
    """A finite float, or ``None`` (JSON certs cannot carry NaN or infinities)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _margin(alternatives: Any) -> float | None:
    if not isinstance(alternatives, list):
        return None
    values = sorted(
        (
            v
            for v in (as_float(a.get("logprob")) for a in alternatives if isinstance(a, dict))
            if v is not None
        ),
        reverse=True,
    )
    return values[0] - values[1] if len(values) >= 2 else None


def parse_logprobs(block: Any) -> TokenLogprobs | None:
    """Parse a ``logprobs`` block in the shapes llama-server uses.

    Accepts the chat/completions shape ``{"content": [{token, logprob, top_logprobs}, ...]}``,
    a bare list of those entries (native ``completion_probabilities``) and the legacy OpenAI
    completions shape ``{"tokens": [...], "token_logprobs": [...], "top_logprobs": [...]}``.
    """
    if isinstance(block, dict) and isinstance(block.get("content"), list):
        entries: Any = block["content"]
    elif isinstance(block, list):
        entries = block
    elif isinstance(block, dict) and isinstance(block.get("tokens"), list):
        toks = [str(t) for t in block["tokens"]]
        lps = [as_float(v) for v in block.get("token_logprobs") or []]
        margins: list[float | None] = []
        for top in block.get("top_logprobs") or []:
            vals = (
                sorted((v for v in map(as_float, top.values()) if v is not None), reverse=True)
                if isinstance(top, dict)
                else []
            )
            margins.append(vals[0] - vals[1] if len(vals) >= 2 else None)
        return TokenLogprobs(tokens=tuple(toks), logprobs=_complete(lps), margins=tuple(margins))
    else:
        return None
    tokens: list[str] = []
    logprobs: list[float | None] = []
    margins2: list[float | None] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        tokens.append(str(entry.get("token", "")))
        logprobs.append(as_float(entry.get("logprob")))
        margins2.append(_margin(entry.get("top_logprobs")))
    return TokenLogprobs(
        tokens=tuple(tokens), logprobs=_complete(logprobs), margins=tuple(margins2)
    )


def _complete(values: Sequence[float | None]) -> tuple[float, ...] | None:
    """All values when every position has a finite one, else ``None`` (no partial record)."""
    if any(v is None for v in values):
        return None
    return tuple(v for v in values if v is not None)


#: llama-server's native ``stop_type`` in the OpenAI ``finish_reason`` words.
_STOP_TYPES: Mapping[str, str] = {"eos": FINISH_STOP, "word": FINISH_STOP, "limit": FINISH_LENGTH}


def finish_reason_from(value: Any) -> str | None:
    """``"stop"``, ``"length"`` (cut by the token budget) or the server's own word."""
    if value is None:
        return None
    word = str(value)
    return _STOP_TYPES.get(word, word)


def parse_completion(test_id: str, payload: Any, *, chat: bool) -> RawResponse:
    """Turn a decoded 200 response into a :class:`RawResponse`.

    A body that does not look like a completion is reported as ``http_error`` (the server
    answered, but not with something to judge).
    """
    if not isinstance(payload, dict):
        return RawResponse(test_id, "http_error", transport_error="response is not a JSON object")
    choices = payload.get("choices")
    text: Any = None
    finish: Any = None
    logprob_block: Any = None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        finish = choice.get("finish_reason")
        logprob_block = choice.get("logprobs")
        if chat:
            message = choice.get("message")
            text = message.get("content") if isinstance(message, dict) else None
            if text is None and isinstance(message, dict):
                text = ""  # e.g. a tool call only: nothing to judge, but a real answer
        else:
            text = choice.get("text")
    elif "content" in payload:  # native /completion shape
        text = payload.get("content")
        finish = payload.get("stop_type")
        logprob_block = payload.get("completion_probabilities")
    if not isinstance(text, str):
        return RawResponse(test_id, "http_error", transport_error="response carries no completion")
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    assert isinstance(usage, dict)
    prompt_tokens = as_int(usage.get("prompt_tokens"))
    completion_tokens = as_int(usage.get("completion_tokens"))
    if prompt_tokens is None:
        prompt_tokens = as_int(payload.get("tokens_evaluated"))
    if completion_tokens is None:
        completion_tokens = as_int(payload.get("tokens_predicted"))
    raw_timings = payload.get("timings")
    timings: dict[str, float] = {}
    if isinstance(raw_timings, dict):
        for key, value in raw_timings.items():
            number = as_float(value)
            if number is not None:
                timings[str(key)] = number
    details = usage.get("prompt_tokens_details")
    cached = as_int(details.get("cached_tokens")) if isinstance(details, dict) else None
    if "cache_n" not in timings and cached is not None:
        # OpenAI-style engines (vLLM, SGLang) report prompt-cache reuse only in the usage.
        timings["cache_n"] = float(cached)
    slot_id = as_int(payload.get("id_slot"))
    verbose = payload.get("__verbose")
    if slot_id is None and isinstance(verbose, dict):
        slot_id = as_int(verbose.get("id_slot"))
    notes: list[str] = []
    cache_n = timings.get("cache_n")
    if cache_n is not None and cache_n != 0:
        notes.append(f"{test_id}: server reused {int(cache_n)} cached prompt tokens (cache_n != 0)")
    parsed = parse_logprobs(logprob_block)
    return RawResponse(
        test_id=test_id,
        failure_mode=None,
        text=text,
        finish_reason=finish_reason_from(finish),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        timings=timings,
        slot_id=slot_id,
        tokens=parsed.tokens if parsed else None,
        token_logprobs=parsed.logprobs if parsed else None,
        top_margins=parsed.margins if parsed else None,
        notes=tuple(notes),
    )
