"""HTTP requests to llama-server's OpenAI-compatible surface.

:class:`RequestTemplate` turns a :class:`~batch_invariance.run.workset.WorkItem` into a request
body that is byte-identical for the same test id in every arm (temperature 0 and ``top_k: 1``,
a fixed per-id seed, ``cache_prompt: false``, the same token budget, and in every arm the
same logprobs fields): the chosen token and the top-2 alternatives of every generated token,
taken before sampling (``--n-probs`` alternatives when given). They are the numeric evidence
(:mod:`batch_invariance.core.numerics` compares them bitwise between arms) and give the
top1-top2 margin at the first divergent token. On the embedded pair, 6 prompts x 96 tokens on
an idle host, top-2 cost 1.06x the server CPU of no logprobs (``benchmarks/bench_logprobs.py``).

``top_k: 1`` leaves the chosen token as it is (at temperature 0 it is the argmax either way)
and makes greedy selection explicit, so the list that survives sampling holds the chosen token
alone. It buys no speed on the embedded pair (measured: 37.2 vs 38.5 ms per token, within
noise, ``benchmarks/bench_logprobs.py`` session notes).

:func:`send` posts a body and always returns a
:class:`~batch_invariance.run.trials.RawResponse`: a transport failure
(timeout, connection error, HTTP error, dropped connection, dead server) is a value with a
failure mode from :data:`batch_invariance.core.evidence.TRANSPORT_MODES`, never an exception.

Sending a set of requests to one server serially: exactly one request in flight.

Faults (README, exit codes): a server that died is an infrastructure failure, so
:func:`run_serial` raises the handle's :class:`~batch_invariance.errors.InfraError` as soon as
its liveness check fails, and never goes on against a dead port. A transient failure of a live
server is retried once, with the same body (one request in flight either way, and a client that
gives up closes its connection, which cancels the request in llama-server). The concurrent pass
(:mod:`batch_invariance.run.dispatch`) never retries.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import requests

from batch_invariance.core.chat_template import sends_chat
from batch_invariance.core.plan import WorkItem, request_key
from batch_invariance.errors import InfraError
from batch_invariance.run.trials import RawResponse, parse_completion

Endpoint = Literal["chat", "completions"]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"

#: The smallest top-k that gives the top1 - top2 margin at the first divergent token (one
#: alternative returns the chosen token only). Measured cost: benchmarks/bench_logprobs.py.
MARGIN_TOP_LOGPROBS = 2

#: Whether a request asks for the pre-sampling alternatives (every arm does; ``none`` is for
#: measuring what they cost).
LogprobMode = Literal["none", "margins"]


def seed_for(run_seed: int, test_id: str) -> int:
    """The per-id sampling seed: stable across arms, runs and machines (31-bit, non-negative)."""
    digest = hashlib.sha256(f"{run_seed}:{test_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class RequestTemplate:
    """How every request of a cell is built. Recorded in the cert via :meth:`to_record`.

    ``endpoint`` picks ``/v1/chat/completions`` or ``/v1/completions``; rows with ``messages``
    always go to chat. ``n_probs`` sets the number of pre-sampling alternatives per token;
    without it :data:`MARGIN_TOP_LOGPROBS` brings back the chosen token and the top-2.
    """

    endpoint: Endpoint
    n_predict: int
    seed: int
    n_probs: int | None = None
    timeout_s: float = 120.0
    logprobs: LogprobMode = "margins"
    #: ``False`` in every arm but one: each request computed from scratch. ``None`` leaves
    #: the field out, as a deployed client sends it (the prompt-cache arm): the server then
    #: reuses what its cache holds.
    cache_prompt: bool | None = False

    @property
    def alternatives(self) -> int | None:
        """The number of alternatives asked for per position (``None``: no logprobs)."""
        if self.logprobs == "none":
            return None
        return self.n_probs if self.n_probs is not None else MARGIN_TOP_LOGPROBS

    def with_logprobs(self, mode: LogprobMode) -> RequestTemplate:
        """The same requests asking for ``mode`` of the distribution."""
        return replace(self, logprobs=mode)

    def as_deployed(self) -> RequestTemplate:
        """The same requests as a deployed client sends them: no ``cache_prompt`` field."""
        return replace(self, cache_prompt=None)

    def _logprob_fields(self, chat: bool) -> dict[str, Any]:
        k = self.alternatives
        if k is None:
            return {}
        return {"logprobs": True, "top_logprobs": k} if chat else {"logprobs": k}

    def uses_chat(self, item: WorkItem) -> bool:
        return sends_chat(self.endpoint, (item,))

    def path_for(self, item: WorkItem) -> str:
        return CHAT_PATH if self.uses_chat(item) else COMPLETIONS_PATH

    def body_for(self, item: WorkItem) -> dict[str, Any]:
        """The JSON body for ``item``; a pure function of the template and the item."""
        common: dict[str, Any] = {
            "temperature": 0,
            "seed": seed_for(self.seed, item.test_id),
            "cache_prompt": self.cache_prompt,
            "max_tokens": self.n_predict,
            "stream": False,
            "top_k": 1,
        }
        if self.cache_prompt is None:
            del common["cache_prompt"]
        if self.uses_chat(item):
            messages: list[dict[str, str]] = []
            if item.system is not None:
                messages.append({"role": "system", "content": item.system})
            if item.messages is not None:
                messages.extend({"role": r, "content": c} for r, c in item.messages)
            else:
                messages.append({"role": "user", "content": item.prompt or ""})
            return {"messages": messages, **common, **self._logprob_fields(chat=True)}
        prompt = item.prompt or ""
        if item.system is not None:
            prompt = f"{item.system}\n\n{prompt}"
        return {"prompt": prompt, **common, **self._logprob_fields(chat=False)}

    def request_key(self, item: WorkItem) -> str:
        """What ``item`` asks the server, as one key (:func:`core.plan.request_key`): the
        path and the body without the per-id seed (greedy decoding at temperature 0 and
        ``top_k`` 1 ignores it) and without the logprob fields each arm sets."""
        body = self.with_logprobs("none").body_for(item)
        del body["seed"]
        return request_key(self.path_for(item), body)

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
            "top_k": 1,
            "logprobs": self._logprob_fields(self.endpoint == "chat"),
            "logprobs_by_arm": {arm: self.logprobs for arm in ("A", "A_repeat", "B", "C")},
            "pre_sampling": True,
            "timeout_s": self.timeout_s,
        }


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


#: Called after each completed request with the response (from any thread).
OnDone = Callable[[RawResponse], None]

#: Failure modes of a live server worth one more try in a serial arm (``server_gone`` is
#: not: a dead server ends the run).
TRANSIENT_MODES: frozenset[str] = frozenset({"timeout", "connection_error", "http_error"})

#: Called with no arguments; raises :class:`InfraError` when the server died.
CheckAlive = Callable[[], None]


@dataclass(frozen=True)
class SerialRun:
    """What a serial arm got back: the answer to each id (the retry's, where one was sent),
    and the failed first attempt of every request that was retried."""

    responses: dict[str, RawResponse]
    first_attempts: dict[str, RawResponse]


def _raise_if_dead(resp: RawResponse, check_alive: CheckAlive | None) -> None:
    """Raise the handle's :class:`InfraError` when ``resp`` failed because the server died."""
    if resp.ok or check_alive is None:
        return
    check_alive()
    if resp.failure_mode == "server_gone":
        raise InfraError(f"the server stopped answering: {resp.transport_error}")


def run_serial(
    base_url: str,
    template: RequestTemplate,
    items: Sequence[WorkItem],
    check_alive: CheckAlive | None = None,
    on_done: OnDone | None = None,
) -> SerialRun:
    """Send ``items`` one at a time, in order, each transient failure retried once.

    Raises :class:`InfraError` when ``check_alive`` says the server died."""
    out: dict[str, RawResponse] = {}
    first_attempts: dict[str, RawResponse] = {}
    with requests.Session() as session:
        for item in items:
            resp = send(session, base_url, template, item, check_alive)
            _raise_if_dead(resp, check_alive)
            if resp.failure_mode in TRANSIENT_MODES:
                first_attempts[item.test_id] = resp
                resp = send(session, base_url, template, item, check_alive)
                _raise_if_dead(resp, check_alive)
            out[item.test_id] = resp
            if on_done is not None:
                on_done(resp)
    if check_alive is not None:
        check_alive()
    return SerialRun(out, first_attempts)
