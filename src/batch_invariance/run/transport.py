"""HTTP requests to llama-server's OpenAI-compatible surface, and what came back.

:class:`RequestTemplate` turns a :class:`~batch_invariance.run.workset.WorkItem` into a request
body that is byte-identical for the same test id in every arm (temperature 0, a fixed per-id
seed, ``cache_prompt: false``, the same token budget), except for the logprobs fields: only the
arms that read them ask for them (A and C: the first divergent token and its top1-top2 margin,
and F4 when armed). The serial controls B and A' leave them off, which drops post-processing
only: at temperature 0 the chosen token is the argmax either way
(``benchmarks/bench_logprobs.py`` checks the texts agree and measures the cost).

:func:`send` posts a body and always returns a :class:`RawResponse`: a transport failure
(timeout, connection error, HTTP error, dropped connection, dead server) is a value with a
failure mode from :data:`batch_invariance.core.evidence.TRANSPORT_MODES`, never an exception.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import requests

from batch_invariance.core.chat_template import sends_chat
from batch_invariance.core.evidence import FINISH_LENGTH, FINISH_STOP
from batch_invariance.core.workitem import WorkItem
from batch_invariance.errors import InfraError

Endpoint = Literal["chat", "completions"]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"

#: The smallest top-k that gives the top1 - top2 margin at the first divergent token (one
#: alternative returns the chosen token only). Measured cost: benchmarks/bench_logprobs.py.
MARGIN_TOP_LOGPROBS = 2

#: The arms whose requests carry logprobs (A vs C is the only comparison that reads them).
LOGPROB_ARMS = ("A", "C")


def seed_for(run_seed: int, test_id: str) -> int:
    """The per-id sampling seed: stable across arms, runs and machines (31-bit, non-negative)."""
    digest = hashlib.sha256(f"{run_seed}:{test_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class RequestTemplate:
    """How every request of a cell is built. Recorded in the cert via :meth:`to_record`.

    ``endpoint`` picks ``/v1/chat/completions`` or ``/v1/completions``; rows with ``messages``
    always go to chat. ``n_probs`` arms per-token alternatives (F4); without it
    :data:`MARGIN_TOP_LOGPROBS` brings back the chosen tokens and the top1 - top2 margin.
    ``logprobs=False`` (:meth:`without_logprobs`, the serial controls) asks for none.
    """

    endpoint: Endpoint
    n_predict: int
    seed: int
    n_probs: int | None = None
    timeout_s: float = 120.0
    logprobs: bool = True

    @property
    def top_k(self) -> int | None:
        """The number of alternatives asked for per position (``None``: no logprobs)."""
        if not self.logprobs:
            return None
        return self.n_probs if self.n_probs is not None else MARGIN_TOP_LOGPROBS

    def without_logprobs(self) -> RequestTemplate:
        """The same requests without token logprobs (for arms that never read them)."""
        return replace(self, logprobs=False)

    def uses_chat(self, item: WorkItem) -> bool:
        return sends_chat(self.endpoint, (item,))

    def path_for(self, item: WorkItem) -> str:
        return CHAT_PATH if self.uses_chat(item) else COMPLETIONS_PATH

    def body_for(self, item: WorkItem) -> dict[str, Any]:
        """The JSON body for ``item``; a pure function of the template and the item."""
        common: dict[str, Any] = {
            "temperature": 0,
            "seed": seed_for(self.seed, item.test_id),
            "cache_prompt": False,
            "max_tokens": self.n_predict,
            "stream": False,
        }
        if self.uses_chat(item):
            messages: list[dict[str, str]] = []
            if item.system is not None:
                messages.append({"role": "system", "content": item.system})
            if item.messages is not None:
                messages.extend({"role": r, "content": c} for r, c in item.messages)
            else:
                messages.append({"role": "user", "content": item.prompt or ""})
            if self.top_k is None:
                return {"messages": messages, **common}
            return {"messages": messages, **common, "logprobs": True, "top_logprobs": self.top_k}
        prompt = item.prompt or ""
        if item.system is not None:
            prompt = f"{item.system}\n\n{prompt}"
        if self.top_k is None:
            return {"prompt": prompt, **common}
        return {"prompt": prompt, **common, "logprobs": self.top_k}

    def encode(self, item: WorkItem) -> bytes:
        """The exact bytes sent for ``item`` (canonical JSON, so every arm sends the same)."""
        return json.dumps(self.body_for(item), sort_keys=True, separators=(",", ":")).encode()

    def to_record(self) -> dict[str, Any]:
        """The template as recorded JSON (for the cert's provenance)."""
        return {
            "endpoint": self.endpoint,
            "paths": {"chat": CHAT_PATH, "completions": COMPLETIONS_PATH},
            "messages_rows_use_chat": True,
            "temperature": 0,
            "seed_rule": "sha256(f'{run_seed}:{test_id}')[:4] & 0x7fffffff",
            "run_seed": self.seed,
            "cache_prompt": False,
            "max_tokens": self.n_predict,
            "stream": False,
            "logprobs": {"chat": {"logprobs": True, "top_logprobs": self.top_k}}
            if self.endpoint == "chat"
            else {"completions": {"logprobs": self.top_k}},
            "logprobs_arms": list(LOGPROB_ARMS),
            "n_probs_armed": self.n_probs is not None,
            "timeout_s": self.timeout_s,
        }


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


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _as_float(value: Any) -> float | None:
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
            for v in (_as_float(a.get("logprob")) for a in alternatives if isinstance(a, dict))
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
        lps = [_as_float(v) for v in block.get("token_logprobs") or []]
        margins: list[float | None] = []
        for top in block.get("top_logprobs") or []:
            vals = (
                sorted((v for v in map(_as_float, top.values()) if v is not None), reverse=True)
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
        logprobs.append(_as_float(entry.get("logprob")))
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
    prompt_tokens = _as_int(usage.get("prompt_tokens"))
    completion_tokens = _as_int(usage.get("completion_tokens"))
    if prompt_tokens is None:
        prompt_tokens = _as_int(payload.get("tokens_evaluated"))
    if completion_tokens is None:
        completion_tokens = _as_int(payload.get("tokens_predicted"))
    raw_timings = payload.get("timings")
    timings: dict[str, float] = {}
    if isinstance(raw_timings, dict):
        for key, value in raw_timings.items():
            number = _as_float(value)
            if number is not None:
                timings[str(key)] = number
    details = usage.get("prompt_tokens_details")
    cached = _as_int(details.get("cached_tokens")) if isinstance(details, dict) else None
    if "cache_n" not in timings and cached is not None:
        # OpenAI-style engines (vLLM, SGLang) report prompt-cache reuse only in the usage.
        timings["cache_n"] = float(cached)
    slot_id = _as_int(payload.get("id_slot"))
    verbose = payload.get("__verbose")
    if slot_id is None and isinstance(verbose, dict):
        slot_id = _as_int(verbose.get("id_slot"))
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


def _error_excerpt(response: requests.Response) -> str:
    try:
        body = response.text
    except Exception:  # a broken body must not hide the status
        body = ""
    body = " ".join(body.split())
    return f"HTTP {response.status_code}: {body[:200]}" if body else f"HTTP {response.status_code}"


def send(
    session: requests.Session,
    base_url: str,
    template: RequestTemplate,
    item: WorkItem,
    check_alive: Callable[[], None] | None = None,
) -> RawResponse:
    """POST one request and return what happened; never raises for transport trouble.

    ``check_alive`` is the server handle's liveness check: when a connection fails and it
    raises :class:`InfraError`, the failure is recorded as ``server_gone``.
    """
    url = base_url.rstrip("/") + template.path_for(item)
    body = template.encode(item)
    chat = template.uses_chat(item)
    dispatch_ts = time.monotonic()
    mode: str
    detail: str
    status: int | None = None
    try:
        response = session.post(
            url,
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=template.timeout_s,
        )
        complete_ts = time.monotonic()
        status = response.status_code
        if status >= 400:
            mode, detail = "http_error", _error_excerpt(response)
        else:
            try:
                payload = response.json()
            except ValueError as exc:
                mode, detail = "http_error", f"HTTP {status}: body is not JSON ({exc})"
            else:
                parsed = parse_completion(item.test_id, payload, chat=chat)
                return replace(
                    parsed, dispatch_ts=dispatch_ts, complete_ts=complete_ts, http_status=status
                )
    except requests.Timeout as exc:
        complete_ts = time.monotonic()
        mode, detail = "timeout", f"no answer within {template.timeout_s:g}s ({type(exc).__name__})"
    except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
        complete_ts = time.monotonic()
        mode, detail = "connection_error", f"{type(exc).__name__}: {exc}"
    except requests.RequestException as exc:
        complete_ts = time.monotonic()
        mode, detail = "connection_error", f"{type(exc).__name__}: {exc}"
    if mode in ("connection_error", "timeout") and check_alive is not None:
        try:
            check_alive()
        except InfraError as exc:
            mode, detail = "server_gone", f"{detail}; server gone: {exc}"
    return RawResponse(
        test_id=item.test_id,
        failure_mode=mode,
        dispatch_ts=dispatch_ts,
        complete_ts=complete_ts,
        http_status=status,
        transport_error=detail[:500],
    )


def get_json(session: requests.Session, url: str, timeout_s: float = 2.0) -> Any | None:
    """GET ``url`` and decode JSON; ``None`` on any failure (used by samplers and probes)."""
    try:
        response = session.get(url, timeout=timeout_s)
        if response.status_code != 200:
            return None
        return response.json()
    except (requests.RequestException, ValueError):
        return None


def server_chat_template(base_url: str) -> str | None:
    """The chat template the server applies (``/props`` ``chat_template``); ``None`` unknown."""
    with requests.Session() as session:
        props = get_json(session, base_url.rstrip("/") + "/props")
    template = props.get("chat_template") if isinstance(props, dict) else None
    return template if isinstance(template, str) else None


def get_text(session: requests.Session, url: str, timeout_s: float = 2.0) -> str | None:
    """GET ``url`` as text; ``None`` on any failure or non-200 status."""
    try:
        response = session.get(url, timeout=timeout_s)
        if response.status_code != 200:
            return None
        return response.text
    except requests.RequestException:
        return None


def busy_from_slots(payload: Any) -> int | None:
    """Number of slots ``/slots`` reports as processing; ``None`` when the shape is unknown."""
    if not isinstance(payload, list):
        return None
    return sum(1 for slot in payload if isinstance(slot, dict) and slot.get("is_processing"))


def tasks_from_slots(payload: Any) -> tuple[int, ...]:
    """Task ids of the slots ``/slots`` reports as processing."""
    if not isinstance(payload, list):
        return ()
    out: list[int] = []
    for slot in payload:
        if isinstance(slot, dict) and slot.get("is_processing"):
            task = _as_int(slot.get("id_task"))
            if task is not None:
                out.append(task)
    return tuple(out)


def busy_from_metrics(text: str, name: str = "llamacpp:requests_processing") -> int | None:
    """The value of a Prometheus gauge in ``/metrics`` text; ``None`` when absent."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) >= 2 and (parts[0] == name or parts[0].startswith(name + "{")):
            try:
                return int(float(parts[1]))
            except ValueError:
                return None
    return None
