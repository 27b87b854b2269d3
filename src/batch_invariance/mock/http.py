"""The mock's HTTP surface: llama-server's endpoints and response shapes over the slot engine.

``/health``, ``/props``, ``/slots``, ``/metrics``, ``/completion``, ``/v1/completions``,
``/v1/chat/completions`` and ``/tokenize``, with llama-server's error bodies.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from batch_invariance.engines.registry import default_engine
from batch_invariance.mock.knobs import Busy, Generation
from batch_invariance.mock.oracle import token_id, tokenize
from batch_invariance.mock.protocols import MockState

#: What the look-alike serves as its template for a model with none: llama-server's fallback.
_FALLBACK = default_engine().fallback_chat_template


def _render_chat(messages: Any) -> str:
    """A Gemma-like chat rendering: what the prompt tokens are counted on."""
    out: list[str] = []
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                out.append(
                    f"<start_of_turn>{m.get('role', 'user')}\n{m.get('content', '')}<end_of_turn>\n"
                )
    out.append("<start_of_turn>model\n")
    return "".join(out)


def _token(piece: str, **value: Any) -> dict[str, Any]:
    """One token as llama-server writes it in a logprobs list, with its ``value`` fields."""
    return {"id": token_id(piece), "token": piece, "bytes": list(piece.encode()), **value}


def _top_alternatives(piece: str, logprob: float, k: int) -> list[dict[str, Any]]:
    alts = [_token(piece, logprob=logprob)]
    for j in range(1, k):
        alts.append(_token(f"{piece.strip() or '_'}~{j}", logprob=logprob - 1.5 * j))
    return alts


def _probs_json(gen: Generation, k: int, post_sampling: bool = False) -> list[dict[str, Any]]:
    if post_sampling:
        # As llama-server with ``post_sampling_probs`` at top_k 1: only the chosen token
        # survives sampling, with probability 1 (``prob``/``top_probs``, no logprobs).
        return [_token(p, prob=1.0, top_probs=[_token(p, prob=1.0)]) for p in gen.pieces]
    return [
        _token(p, logprob=lp, top_logprobs=_top_alternatives(p, lp, k))
        for p, lp in zip(gen.pieces, gen.logprobs, strict=True)
    ]


def _timings(gen: Generation) -> dict[str, float]:
    n_gen = len(gen.pieces)
    return {
        "cache_n": gen.cache_n,
        "prompt_n": gen.prompt_tokens - gen.cache_n,
        "prompt_ms": gen.prompt_ms,
        "prompt_per_token_ms": gen.prompt_ms / max(gen.prompt_tokens, 1),
        "prompt_per_second": gen.prompt_tokens / max(gen.prompt_ms / 1000.0, 1e-9),
        "predicted_n": n_gen,
        "predicted_ms": gen.predicted_ms,
        "predicted_per_token_ms": gen.predicted_ms / max(n_gen, 1),
        "predicted_per_second": n_gen / max(gen.predicted_ms / 1000.0, 1e-9),
    }


def _usage(gen: Generation) -> dict[str, Any]:
    return {
        "completion_tokens": len(gen.pieces),
        "prompt_tokens": gen.prompt_tokens,
        "total_tokens": len(gen.pieces) + gen.prompt_tokens,
        "prompt_tokens_details": {"cached_tokens": gen.cache_n},
    }


def _error(code: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "type": kind}}


_COMPLETION_PATHS = ("/completion", "/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class _Completion:
    """A completion request as the look-alike reads it."""

    #: ``/v1/chat/completions`` (messages rendered as a chat), else a raw prompt.
    chat: bool
    prompt_text: str
    #: How many alternatives per token the logprobs list carries (0: no logprobs).
    k: int
    n_predict: int


def _tokenize_json(body: dict[str, Any]) -> dict[str, Any]:
    """The ``/tokenize`` answer: token ids, or ids with their pieces (``with_pieces``)."""
    pieces = tokenize(str(body.get("content", "")))
    if body.get("with_pieces"):
        return {"tokens": [{"id": token_id(p), "piece": p} for p in pieces]}
    return {"tokens": [token_id(p) for p in pieces]}


def _completion_json(gen: Generation, k: int) -> dict[str, Any]:
    """llama-server's native ``/completion`` answer."""
    payload: dict[str, Any] = {
        "index": 0,
        "content": gen.text,
        "tokens": [],
        "id_slot": gen.slot_id,
        "stop": True,
        "model": "mock",
        "tokens_predicted": len(gen.pieces),
        "tokens_evaluated": gen.prompt_tokens,
        "stop_type": "eos" if gen.finish_reason == "stop" else "limit",
        "tokens_cached": gen.prompt_tokens + len(gen.pieces),
        "timings": _timings(gen),
    }
    if k > 0:
        payload["completion_probabilities"] = _probs_json(gen, k)
    return payload


def _openai_json(gen: Generation, request: _Completion, post_sampling: bool) -> dict[str, Any]:
    """The OpenAI-compatible answer (``/v1/completions``, ``/v1/chat/completions``)."""
    k = request.k
    logprobs: Any = {"content": _probs_json(gen, k, post_sampling)} if k > 0 else None
    choice: dict[str, Any] = {"index": 0, "finish_reason": gen.finish_reason}
    if request.chat:
        choice["message"] = {"role": "assistant", "content": gen.text}
        if logprobs is not None:
            choice["logprobs"] = logprobs
    else:
        choice["text"] = gen.text
        choice["logprobs"] = logprobs
    return {
        "choices": [choice],
        "created": int(time.time()),
        "model": "mock",
        "system_fingerprint": "batch-invariance-mock",
        "object": "chat.completion" if request.chat else "text_completion",
        "usage": _usage(gen),
        "id": f"cmpl-mock-{gen.task_id}",
        "timings": _timings(gen),
    }  # fmt: skip


class MockHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler; one instance per connection."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; without TCP_NODELAY, Nagle plus delayed ACKs
    # add ~40 ms to every keep-alive request.
    disable_nagle_algorithm = True
    mock: MockState

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read their output
        return

    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        body = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (e.g. its timeout); nothing to do

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else {}

    def do_GET(self) -> None:
        mock = self.mock
        path = self.path.split("?", 1)[0]
        if path == "/health":
            if mock.loading:
                self._send(503, _error(503, "Loading model", "unavailable_error"))
            else:
                self._send(200, {"status": "ok"})
            return
        if mock.loading:
            self._send(503, _error(503, "Loading model", "unavailable_error"))
            return
        if path == "/props":
            self._send(200, {
                "total_slots": mock.parallel,
                "default_generation_settings": {"n_ctx": mock.ctx},
                "model_path": "mock.gguf",
                "build_info": "batch-invariance mock",
                "endpoint_slots": mock.knobs.slots_endpoint,
                "endpoint_metrics": mock.knobs.metrics,
                "chat_template": mock.knobs.chat_template or _FALLBACK,
            })  # fmt: skip
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "mock", "object": "model"}]})
        elif path == "/slots":
            if not mock.knobs.slots_endpoint:
                self._send(
                    501,
                    _error(
                        501, "This server does not support slots endpoint.", "not_supported_error"
                    ),
                )
            else:
                self._send(200, mock.slots_json())
        elif path == "/metrics":
            if not mock.knobs.metrics:
                self._send(
                    501,
                    _error(
                        501, "This server does not support metrics endpoint.", "not_supported_error"
                    ),
                )
            else:
                self._send(200, mock.metrics_text(), "text/plain; version=0.0.4")
        else:
            self._send(404, _error(404, "File Not Found", "not_found_error"))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        body = self._json_object()
        if body is None or not self._accepting():
            return
        if path == "/tokenize":
            self._send(200, _tokenize_json(body))
            return
        if path not in _COMPLETION_PATHS:
            self._send(404, _error(404, "File Not Found", "not_found_error"))
            return
        request = self._completion_request(path, body)
        if request is None:
            return
        gen = self._generate(request, body)
        if gen is None:
            return
        if path == "/completion":
            self._send(200, _completion_json(gen, request.k))
        else:
            self._send(200, _openai_json(gen, request, bool(body.get("post_sampling_probs"))))

    def _json_object(self) -> dict[str, Any] | None:
        """The request's body as a JSON object; None once a 400 answered a body that is not."""
        try:
            body = self._body()
        except (ValueError, UnicodeDecodeError):
            self._send(400, _error(400, "invalid JSON body", "invalid_request_error"))
            return None
        if not isinstance(body, dict):
            self._send(400, _error(400, "body must be a JSON object", "invalid_request_error"))
            return None
        return body

    def _accepting(self) -> bool:
        """False (the request answered, or its connection dropped) while the server is dead or
        still loading."""
        if self.mock.dead:
            self.close_connection = True  # drop the connection without an answer
            return False
        if self.mock.loading:
            self._send(503, _error(503, "Loading model", "unavailable_error"))
            return False
        return True

    def _completion_request(self, path: str, body: dict[str, Any]) -> _Completion | None:
        """What a completion body asks for; None once a 400 answered ``top_logprobs`` asked
        without ``logprobs`` (chat)."""
        chat = path == "/v1/chat/completions"
        if chat:
            prompt_text = _render_chat(body.get("messages"))
            if body.get("logprobs"):
                k = int(body.get("top_logprobs", 20))
            elif body.get("top_logprobs") is not None:
                self._send(
                    400,
                    _error(
                        400,
                        "top_logprobs requires logprobs to be set to true",
                        "invalid_request_error",
                    ),
                )
                return None
            else:
                k = 0
        else:
            prompt_text = str(body.get("prompt", ""))
            k = int(body.get("n_probs", body.get("logprobs", 0)) or 0)
        raw_n = body.get("n_predict", body.get("max_tokens"))
        n_predict = int(raw_n) if isinstance(raw_n, (int, float)) else -1
        if n_predict < 0:
            n_predict = 1 << 20
        return _Completion(chat=chat, prompt_text=prompt_text, k=k, n_predict=n_predict)

    def _generate(self, request: _Completion, body: dict[str, Any]) -> Generation | None:
        """Generate on a slot; None once a 500 (the fail-once knob) or the busy status (a
        refused request) answered instead."""
        mock = self.mock
        if mock.fails_now(request.prompt_text):
            self._send(500, _error(500, "transient failure (mock knob)", "server_error"))
            return None
        try:
            # llama-server caches prompts unless the request says cache_prompt: false.
            cache_prompt = body.get("cache_prompt", True) is not False
            gen = mock.generate(request.prompt_text, request.n_predict, cache_prompt)
            mock.count_answer()
        except Busy:
            status = mock.knobs.http_error_status
            self._send(status, _error(status, "server busy (mock under load)", "unavailable_error"))
            return None
        return gen
