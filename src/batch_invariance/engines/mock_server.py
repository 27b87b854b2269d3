"""An in-process llama-server look-alike on loopback, for fast tests and the mock demo.

:class:`MockServer` serves the endpoints the driver uses (``/health``, ``/props``, ``/slots``,
``/metrics``, ``/completion``, ``/v1/completions``, ``/v1/chat/completions``, ``/tokenize``)
from a ``ThreadingHTTPServer`` on ``127.0.0.1`` and a free port. It really runs N slots at once:
a request holds a slot while it "generates" with a per-token delay, and requests beyond N wait
for a free slot, so concurrent requests genuinely overlap and ``/slots`` shows it.

Completions are derived from the prompt: questions of a few known shapes (arithmetic, capitals,
secret codes, reversing or upper-casing a word, counting letters) get their right answer, so a
scorer has something real to judge; anything else gets a deterministic filler sentence.
:class:`MockKnobs` injects the faults the verdict must tell apart. :class:`MockLauncher`
implements :class:`batch_invariance.run.cell.ServerLauncher` over it.

This is never a substitute for the real server: certs from it are ``source=mock``.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import requests

from batch_invariance.errors import InfraError

#: The tokenizer's pieces: optional leading whitespace plus a word or one symbol, or trailing
#: whitespace. Concatenating the pieces gives back the text exactly.
_PIECE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")

_CAPITALS: Mapping[str, str] = {
    "france": "Paris",
    "japan": "Tokyo",
    "italy": "Rome",
    "germany": "Berlin",
    "spain": "Madrid",
    "canada": "Ottawa",
    "egypt": "Cairo",
    "kenya": "Nairobi",
    "peru": "Lima",
    "norway": "Oslo",
}

_FILLER = (
    "the", "model", "reads", "a", "long", "prompt", "and", "writes", "short", "notes",
    "about", "batches", "slots", "tokens", "servers", "quietly", "today",
)  # fmt: skip


def tokenize(text: str) -> list[str]:
    """Split ``text`` into the mock's token pieces (deterministic, lossless)."""
    return _PIECE.findall(text)


def token_id(piece: str) -> int:
    """A stable id for a piece (the mock has no vocabulary file)."""
    return 10 + zlib.crc32(piece.encode()) % 50000


def _clean_word(text: str) -> str:
    return text.strip().strip(".,;:!?\"'")


def answer_for(prompt: str) -> str:
    """The mock's (correct) answer to a prompt: a pure function of the text."""
    text = prompt
    m = re.search(r"what is (-?\d+)\s*([-+*x×])\s*(-?\d+)", text, re.IGNORECASE)
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return str(value)
    m = re.search(r"secret code is ([A-Za-z0-9-]+)", text, re.IGNORECASE)
    if m and re.search(r"what is the secret code", text, re.IGNORECASE):
        return m.group(1)
    m = re.search(r"capital of ([A-Za-z]+)", text, re.IGNORECASE)
    if m and m.group(1).lower() in _CAPITALS:
        return _CAPITALS[m.group(1).lower()]
    m = re.search(r"reverse the word ([A-Za-z]+)", text, re.IGNORECASE)
    if m:
        return m.group(1)[::-1]
    m = re.search(r"spell ([A-Za-z]+) in (?:upper ?case|capitals)", text, re.IGNORECASE)
    if m:
        return m.group(1).upper()
    m = re.search(r"how many letters (?:are )?in (?:the word )?([A-Za-z]+)", text, re.IGNORECASE)
    if m:
        return str(len(m.group(1)))
    return note_for(text)


#: Open questions get a note of this many words or more (a few more by hash): long enough for
#: the answer-length floor of a GREEN (64 tokens), so a late divergence has room to show.
NOTE_MIN_WORDS = 66
NOTE_EXTRA_WORDS = 24


def note_for(text: str) -> str:
    """A deterministic note of filler words for an open prompt, one token per word and no
    final punctuation (so a first-line scorer and exact match read the same answer). Chat
    markup is ignored: the same question gets the same note through either endpoint."""
    question = re.sub(r"<start_of_turn>\w*\n|<end_of_turn>\n?", "", text).strip()
    stream = hashlib.sha256(question.encode()).digest()
    while len(stream) < 1 + NOTE_MIN_WORDS + NOTE_EXTRA_WORDS:
        stream += hashlib.sha256(stream).digest()
    n_words = NOTE_MIN_WORDS + stream[0] % NOTE_EXTRA_WORDS
    words = [_FILLER[b % len(_FILLER)] for b in stream[1 : 1 + n_words]]
    return " ".join(words).capitalize()


def diverged_answer(answer: str) -> str:
    """A score-bearing change of ``answer``: what batching noise would do to a right answer."""
    if re.fullmatch(r"-?\d+", answer):
        return str(int(answer) + 1)
    if not answer:
        return "?"
    last = answer[-1]
    if last.isalpha():
        base = "a" if last.islower() else "A"
        return answer[:-1] + chr(ord(base) + (ord(last) - ord(base) + 1) % 26)
    return answer + "!"


@dataclass(frozen=True)
class MockKnobs:
    """Faults and timing of the mock. The defaults give a well-behaved, batch-invariant server."""

    #: Score-bearing change of content when another slot was busy during generation.
    cobatch_divergence: bool = False
    #: Same answer, different tokens and logprobs when co-batched (a trailing newline and a
    #: different split), so the invariant fields stay equal.
    token_divergence: bool = False
    #: Probability that any request's answer changes (seeded by ``seed``), in every arm.
    divergence_probability: float = 0.0
    #: Prompts containing any of these substrings get an empty completion.
    empty_if_contains: tuple[str, ...] = ()
    #: Prompts containing any of these substrings hang ``hang_s`` seconds (holding a slot).
    hang_if_contains: tuple[str, ...] = ()
    hang_s: float = 2.0
    #: Answer HTTP ``http_error_status`` when a request arrives while at least this many slots
    #: are busy (``None``: never).
    http_error_min_busy: int | None = None
    http_error_status: int = 503
    #: ``/health`` answers 503 (and other endpoints refuse) for this long after start.
    loading_delay_s: float = 0.0
    #: Simulated time per generated token and per prompt token.
    token_delay_s: float = 0.0005
    prompt_token_delay_s: float = 0.001
    #: Serve ``/metrics`` (as ``llama-server --metrics``) and ``/slots``.
    metrics: bool = True
    slots_endpoint: bool = True
    #: Serve this many slots on the B/C server whatever was asked (1 = a server that cannot
    #: co-batch behind the C arm).
    bc_parallel_override: int | None = None
    #: The server "dies" (stops listening and drops every connection) after answering this
    #: many completion requests (``None``: never).
    die_after_requests: int | None = None
    seed: int = 0


@dataclass
class _Slot:
    index: int
    processing: bool = False
    id_task: int | None = None


@dataclass(frozen=True)
class Generation:
    """What one request produced (before shaping it as JSON)."""

    text: str
    pieces: tuple[str, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    prompt_tokens: int
    slot_id: int
    task_id: int
    prompt_ms: float
    predicted_ms: float
    cobatched: bool


class _Busy(Exception):
    """Refused under load (the http-errors knob)."""


@dataclass
class MockStats:
    """Server-side truth, for tests: how many requests, how many slots busy at most."""

    requests: int = 0
    max_busy: int = 0
    cobatched: int = 0
    refused: int = 0
    task_ids: list[int] = field(default_factory=list)


class MockServer:
    """A loopback llama-server look-alike with ``parallel`` real concurrent slots.

    Use as a context manager; ``base_url`` is valid inside it. ``check_alive`` raises
    :class:`InfraError` once it has stopped.
    """

    def __init__(self, parallel: int = 1, ctx: int = 2048, knobs: MockKnobs | None = None) -> None:
        if parallel < 1:
            raise ValueError("parallel must be >= 1")
        self.parallel = parallel
        self.ctx = ctx
        self.knobs = knobs or MockKnobs()
        self.stats = MockStats()
        self._slots = [_Slot(i) for i in range(parallel)]
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._rng = random.Random(f"mock:{self.knobs.seed}")
        self._next_task = 0
        self._started_at = 0.0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._prompt_tokens_total = 0
        self._predicted_tokens_total = 0
        self._answered = 0

    # ----- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> MockServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        server = self

        class Handler(_Handler):
            mock = server

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._started_at = time.monotonic()
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
            name="bi-mock-server",
        )  # fmt: skip
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("mock server not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def check_alive(self) -> None:
        if self._httpd is None or self._stop.is_set():
            raise InfraError("mock server has stopped")

    @property
    def dead(self) -> bool:
        """True once the server stopped (closed, or died by the ``die_after_requests`` knob)."""
        return self._stop.is_set()

    def count_answer(self) -> None:
        """Count one answered completion; past ``die_after_requests`` the server dies."""
        limit = self.knobs.die_after_requests
        with self._cond:
            self._answered += 1
            dying = limit is not None and self._answered >= limit and not self._stop.is_set()
            if dying:
                self._stop.set()
                self._cond.notify_all()
        if dying and self._httpd is not None:
            # Stop listening from another thread (shutdown() waits for serve_forever()).
            threading.Thread(target=self._die, daemon=True).start()

    def _die(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    @property
    def loading(self) -> bool:
        return time.monotonic() - self._started_at < self.knobs.loading_delay_s

    # ----- state views -----------------------------------------------------------------------

    def busy_count(self) -> int:
        with self._cond:
            return sum(1 for s in self._slots if s.processing)

    def slots_json(self) -> list[dict[str, Any]]:
        with self._cond:
            return [
                {
                    "id": s.index,
                    "id_task": s.id_task if s.id_task is not None else -1,
                    "n_ctx": self.ctx,
                    "speculative": False,
                    "is_processing": s.processing,
                }
                for s in self._slots
            ]

    def metrics_text(self) -> str:
        busy = self.busy_count()
        lines = [
            "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.",
            "# TYPE llamacpp:prompt_tokens_total counter",
            f"llamacpp:prompt_tokens_total {self._prompt_tokens_total}",
            "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.",
            "# TYPE llamacpp:tokens_predicted_total counter",
            f"llamacpp:tokens_predicted_total {self._predicted_tokens_total}",
            "# HELP llamacpp:requests_processing Number of requests processing.",
            "# TYPE llamacpp:requests_processing gauge",
            f"llamacpp:requests_processing {busy}",
            "# HELP llamacpp:requests_deferred Number of requests deferred.",
            "# TYPE llamacpp:requests_deferred gauge",
            "llamacpp:requests_deferred 0",
        ]
        return "\n".join(lines) + "\n"

    # ----- generation ------------------------------------------------------------------------

    def _acquire(self) -> _Slot:
        with self._cond:
            busy = sum(1 for s in self._slots if s.processing)
            k = self.knobs.http_error_min_busy
            if k is not None and busy >= k:
                self.stats.refused += 1
                raise _Busy
            while True:
                if self._stop.is_set():
                    raise _Busy
                for slot in self._slots:
                    if not slot.processing:
                        slot.processing = True
                        slot.id_task = self._next_task
                        self._next_task += 1
                        now_busy = sum(1 for s in self._slots if s.processing)
                        self.stats.max_busy = max(self.stats.max_busy, now_busy)
                        self.stats.requests += 1
                        self.stats.task_ids.append(slot.id_task)
                        return slot
                self._cond.wait(timeout=0.1)

    def _release(self, slot: _Slot) -> None:
        with self._cond:
            slot.processing = False
            self._cond.notify_all()

    def generate(self, prompt_text: str, n_predict: int) -> Generation:
        """Run one request on a free slot (waiting for one); raises :class:`_Busy` on refusal."""
        knobs = self.knobs
        slot = self._acquire()
        try:
            task_id = slot.id_task if slot.id_task is not None else -1
            prompt_tokens = len(tokenize(prompt_text)) + 1  # + BOS
            t0 = time.monotonic()
            self._stop.wait(prompt_tokens * knobs.prompt_token_delay_s)
            t1 = time.monotonic()
            if any(s in prompt_text for s in knobs.hang_if_contains):
                self._stop.wait(knobs.hang_s)
            if any(s in prompt_text for s in knobs.empty_if_contains):
                answer = ""
            else:
                answer = answer_for(prompt_text)
            planned = tokenize(answer)
            cobatched = False
            for _ in range(max(1, min(len(planned), n_predict))):
                if self.busy_count() > 1:
                    cobatched = True
                self._stop.wait(knobs.token_delay_s)
            if self.busy_count() > 1:
                cobatched = True
            t2 = time.monotonic()
            text = answer
            if cobatched and knobs.cobatch_divergence:
                text = diverged_answer(text)
            if knobs.divergence_probability > 0:
                with self._cond:
                    draw = self._rng.random()
                if draw < knobs.divergence_probability:
                    text = diverged_answer(text)
            token_only = cobatched and knobs.token_divergence and bool(text)
            if token_only:
                pieces = [*_resplit(tokenize(text)), "\n"]
                text = "".join(pieces)
            else:
                pieces = tokenize(text)
            finish = "stop"
            if len(pieces) > n_predict:
                pieces = pieces[:n_predict]
                text = "".join(pieces)
                finish = "length"
            drift = 0.05 if token_only else 0.0
            logprobs = tuple(
                -((zlib.crc32(f"{i}:{p}".encode()) % 500) / 10000.0) - drift
                for i, p in enumerate(pieces)
            )
            with self._cond:
                self._prompt_tokens_total += prompt_tokens
                self._predicted_tokens_total += len(pieces)
                if cobatched:
                    self.stats.cobatched += 1
            return Generation(
                text=text,
                pieces=tuple(pieces),
                logprobs=logprobs,
                finish_reason=finish,
                prompt_tokens=prompt_tokens,
                slot_id=slot.index,
                task_id=task_id,
                prompt_ms=(t1 - t0) * 1000.0,
                predicted_ms=(t2 - t1) * 1000.0,
                cobatched=cobatched,
            )
        finally:
            self._release(slot)


def _resplit(pieces: list[str]) -> list[str]:
    """The same text in a different segmentation: the first long piece split in two."""
    for i, piece in enumerate(pieces):
        core = piece.lstrip()
        if len(core) >= 2:
            cut = len(piece) - len(core) + len(core) // 2
            return [*pieces[:i], piece[:cut], piece[cut:], *pieces[i + 1 :]]
    return list(pieces)


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


def _top_alternatives(piece: str, logprob: float, k: int) -> list[dict[str, Any]]:
    alts = [
        {"id": token_id(piece), "token": piece, "bytes": list(piece.encode()), "logprob": logprob}
    ]
    for j in range(1, k):
        alt = f"{piece.strip() or '_'}~{j}"
        alts.append(
            {
                "id": token_id(alt),
                "token": alt,
                "bytes": list(alt.encode()),
                "logprob": logprob - 1.5 * j,
            }
        )
    return alts


def _probs_json(gen: Generation, k: int) -> list[dict[str, Any]]:
    return [
        {
            "id": token_id(p),
            "token": p,
            "bytes": list(p.encode()),
            "logprob": lp,
            "top_logprobs": _top_alternatives(p, lp, k),
        }
        for p, lp in zip(gen.pieces, gen.logprobs, strict=True)
    ]


def _timings(gen: Generation) -> dict[str, float]:
    n_gen = len(gen.pieces)
    return {
        "cache_n": 0,
        "prompt_n": gen.prompt_tokens,
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
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def _error(code: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "type": kind}}


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler; one instance per connection."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; without TCP_NODELAY, Nagle plus delayed ACKs
    # add ~40 ms to every keep-alive request.
    disable_nagle_algorithm = True
    mock: MockServer

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
            })  # fmt: skip
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
        mock = self.mock
        path = self.path.split("?", 1)[0]
        try:
            body = self._body()
        except (ValueError, UnicodeDecodeError):
            self._send(400, _error(400, "invalid JSON body", "invalid_request_error"))
            return
        if not isinstance(body, dict):
            self._send(400, _error(400, "body must be a JSON object", "invalid_request_error"))
            return
        if mock.dead:
            self.close_connection = True  # drop the connection without an answer
            return
        if mock.loading:
            self._send(503, _error(503, "Loading model", "unavailable_error"))
            return
        if path == "/tokenize":
            pieces = tokenize(str(body.get("content", "")))
            if body.get("with_pieces"):
                self._send(200, {"tokens": [{"id": token_id(p), "piece": p} for p in pieces]})
            else:
                self._send(200, {"tokens": [token_id(p) for p in pieces]})
            return
        if path not in ("/completion", "/v1/completions", "/v1/chat/completions"):
            self._send(404, _error(404, "File Not Found", "not_found_error"))
            return
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
                return
            else:
                k = 0
        else:
            prompt_text = str(body.get("prompt", ""))
            k = int(body.get("n_probs", body.get("logprobs", 0)) or 0)
        raw_n = body.get("n_predict", body.get("max_tokens"))
        n_predict = int(raw_n) if isinstance(raw_n, (int, float)) else -1
        if n_predict < 0:
            n_predict = 1 << 20
        try:
            gen = mock.generate(prompt_text, n_predict)
            mock.count_answer()
        except _Busy:
            status = mock.knobs.http_error_status
            self._send(status, _error(status, "server busy (mock under load)", "unavailable_error"))
            return
        if path == "/completion":
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
            self._send(200, payload)
            return
        logprobs: Any = {"content": _probs_json(gen, k)} if k > 0 else None
        choice: dict[str, Any] = {"index": 0, "finish_reason": gen.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": gen.text}
            if logprobs is not None:
                choice["logprobs"] = logprobs
        else:
            choice["text"] = gen.text
            choice["logprobs"] = logprobs
        self._send(200, {
            "choices": [choice],
            "created": int(time.time()),
            "model": "mock",
            "system_fingerprint": "batch-invariance-mock",
            "object": "chat.completion" if chat else "text_completion",
            "usage": _usage(gen),
            "id": f"cmpl-mock-{gen.task_id}",
            "timings": _timings(gen),
        })  # fmt: skip


# ----- the launcher ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MockHandle:
    """A running mock server as the driver sees it (satisfies ``driver.ServerHandle``)."""

    server: MockServer
    label: str
    argv: tuple[str, ...]
    metrics_enabled: bool
    kv_label: str

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def check_alive(self) -> None:
        self.server.check_alive()

    def info(self) -> Mapping[str, Any]:
        return {
            "kind": "mock",
            "label": self.label,
            "total_slots": self.server.parallel,
            "ctx": self.server.ctx,
            "knobs": asdict(self.server.knobs),
        }


def wait_ready(base_url: str, deadline_s: float, check_alive: Any = None) -> None:
    """Poll ``/health`` until 200; :class:`InfraError` when the deadline passes."""
    end = time.monotonic() + deadline_s
    with requests.Session() as session:
        while True:
            if check_alive is not None:
                check_alive()
            try:
                if session.get(base_url + "/health", timeout=1.0).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > end:
                raise InfraError(f"mock server at {base_url} not ready within {deadline_s:g}s")
            time.sleep(0.02)


class MockLauncher:
    """Launches :class:`MockServer`s for the driver: ``parallel=1`` for A, N for B/C."""

    def __init__(self, knobs: MockKnobs | None = None, ready_timeout_s: float = 30.0) -> None:
        self.knobs = knobs or MockKnobs()
        self.ready_timeout_s = ready_timeout_s
        self.launches = 0
        #: Every server this launcher started, in order (for tests to inspect afterwards).
        self.servers: list[MockServer] = []

    #: An in-process mock is never a live server.
    source: Literal["live", "mock"] = "mock"

    def kv_label_for(self, parallel: int, ctx: int) -> str:
        return f"mock:per-slot-kv:{parallel}x{ctx}"

    def argv_for(self, parallel: int, ctx: int) -> tuple[str, ...]:
        argv = ["mock-llama-server", "--host", "127.0.0.1", "--port", "0",
                "--parallel", str(parallel), "-c", str(ctx * parallel)]  # fmt: skip
        if self.knobs.metrics:
            argv.append("--metrics")
        return tuple(argv)

    @contextmanager
    def launch(self, arm: str, parallel: int, ctx: int) -> Iterator[MockHandle]:
        served = parallel
        if arm != "A" and self.knobs.bc_parallel_override is not None:
            served = self.knobs.bc_parallel_override
        server = MockServer(parallel=served, ctx=ctx, knobs=self.knobs)
        self.launches += 1
        self.servers.append(server)
        with server:
            wait_ready(server.base_url, self.knobs.loading_delay_s + self.ready_timeout_s,
                       server.check_alive)  # fmt: skip
            yield MockHandle(
                server=server,
                label=f"mock-{arm}",
                argv=self.argv_for(served, ctx),
                metrics_enabled=self.knobs.metrics,
                kv_label=self.kv_label_for(served, ctx),
            )
