"""The mock's slot engine: ``parallel`` real concurrent slots behind a loopback HTTP server.

A request holds a slot while it "generates" with a per-token delay, and requests beyond N wait
for a free slot, so concurrent requests genuinely overlap and ``/slots`` shows it.
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

from batch_invariance.errors import InfraError
from batch_invariance.mock.http import MockHandler
from batch_invariance.mock.knobs import Busy, Generation, MockKnobs, MockStats
from batch_invariance.mock.oracle import answer_for, diverged_answer, resplit, tokenize


@dataclass
class _Slot:
    index: int
    processing: bool = False
    id_task: int | None = None


@dataclass(frozen=True)
class _Tokens:
    """What a request generated, as tokens: the text, its pieces, why it stopped, and whether
    the token-divergence knob split the text differently."""

    text: str
    pieces: tuple[str, ...]
    finish_reason: str
    token_only: bool


class MockServer:
    """A loopback llama-server look-alike with ``parallel`` real concurrent slots.

    Use as a context manager; ``base_url`` is valid inside it. ``check_alive`` raises
    :class:`InfraError` once it has stopped.
    """

    def __init__(
        self,
        parallel: int = 1,
        ctx: int = 2048,
        knobs: MockKnobs | None = None,
        *,
        port: int = 0,
        handler: type[MockHandler] = MockHandler,
        instance: int = 0,
        prompt_cache: bool = False,
    ) -> None:
        """``port`` 0 picks a free one; ``handler`` gives another engine's HTTP surface over the
        same slots (the protocol fakes for vLLM and SGLang); ``instance`` numbers the launch
        (each instance draws its own run-to-run noise); ``prompt_cache`` plays a server with its
        prompt cache on: a request that does not say ``cache_prompt: false`` reuses the longest
        token prefix it shares with a prompt seen before, and reports it as ``cache_n``."""
        if parallel < 1:
            raise ValueError("parallel must be >= 1")
        self.parallel = parallel
        self.ctx = ctx
        self.knobs = knobs or MockKnobs()
        self.stats = MockStats()
        self._slots = [_Slot(i) for i in range(parallel)]
        self._cond = threading.Condition()
        self._stop = threading.Event()
        # Each server instance draws its own noise (``instance``): run-to-run nondeterminism
        # differs between two launches, as it would between two real server processes.
        # A draw is keyed by the prompt and how often this instance has seen it, not by
        # arrival order, so concurrent requests draw the same noise however threads interleave.
        self._noise_key = f"mock:{self.knobs.seed}:{instance}"
        self._seen: dict[str, int] = {}
        self._next_task = 0
        self._started_at = 0.0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._prompt_tokens_total = 0
        self._predicted_tokens_total = 0
        self._answered = 0
        self._failed_once: set[str] = set()
        self._port = port
        self._handler = handler
        self.prompt_cache = prompt_cache
        self._cached_prompts: list[list[str]] = []

    # ----- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> MockServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        server = self
        handler = type("Handler", (self._handler,), {"mock": server})
        httpd = ThreadingHTTPServer(("127.0.0.1", self._port), handler)
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

    def fails_now(self, prompt_text: str) -> bool:
        """True the first time a prompt the ``fail_once_if_contains`` knob names arrives."""
        if not any(s in prompt_text for s in self.knobs.fail_once_if_contains):
            return False
        with self._cond:
            first = prompt_text not in self._failed_once
            self._failed_once.add(prompt_text)
        return first

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
                raise Busy
            while True:
                if self._stop.is_set():
                    raise Busy
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

    def _reuse(self, prompt_text: str, cache_prompt: bool) -> int:
        """Prompt tokens reused from the cache (the longest prefix shared with a prompt seen
        before, BOS included), remembering this prompt; 0 with the cache off."""
        if not (self.prompt_cache and cache_prompt):
            return 0
        tokens = ["<bos>", *tokenize(prompt_text)]
        with self._cond:
            best = 0
            for seen in self._cached_prompts:
                n = 0
                for x, y in zip(seen, tokens, strict=False):
                    if x != y:
                        break
                    n += 1
                best = max(best, n)
            self._cached_prompts.append(tokens)
        # As llama-server: at least the last prompt token is always evaluated.
        return min(best, len(tokens) - 1)

    def generate(self, prompt_text: str, n_predict: int, cache_prompt: bool = False) -> Generation:
        """Run one request on a free slot (waiting for one); raises :class:`Busy` on refusal."""
        knobs = self.knobs
        slot = self._acquire()
        try:
            task_id = slot.id_task if slot.id_task is not None else -1
            prompt_tokens = len(tokenize(prompt_text)) + 1  # + BOS
            cache_n = self._reuse(prompt_text, cache_prompt)
            t0 = time.monotonic()
            self._stop.wait((prompt_tokens - cache_n) * knobs.prompt_token_delay_s)
            t1 = time.monotonic()
            if any(s in prompt_text for s in knobs.hang_if_contains):
                self._stop.wait(knobs.hang_s)
            if any(s in prompt_text for s in knobs.empty_if_contains):
                answer = ""
            else:
                answer = answer_for(prompt_text)
            cobatched = self._decode(len(tokenize(answer)), n_predict)
            t2 = time.monotonic()
            text = self._diverge(answer, prompt_text, cobatched, cache_n)
            out = self._tokens(text, cobatched, n_predict)
            logprobs = _logprobs(out.pieces, self._drift(out, cobatched, cache_n))
            with self._cond:
                self._prompt_tokens_total += prompt_tokens
                self._predicted_tokens_total += len(out.pieces)
                if cobatched:
                    self.stats.cobatched += 1
                    self.stats.cobatched_prompts.add(prompt_text)
            return Generation(
                text=out.text,
                pieces=out.pieces,
                logprobs=logprobs,
                finish_reason=out.finish_reason,
                prompt_tokens=prompt_tokens,
                slot_id=slot.index,
                task_id=task_id,
                prompt_ms=(t1 - t0) * 1000.0,
                predicted_ms=(t2 - t1) * 1000.0,
                cobatched=cobatched,
                cache_n=cache_n,
            )
        finally:
            self._release(slot)

    def _decode(self, n_planned: int, n_predict: int) -> bool:
        """Wait out the decode, one token delay per token; True when another request held a
        slot at any step (co-batched)."""
        cobatched = False
        for _ in range(max(1, min(n_planned, n_predict))):
            if self.busy_count() > 1:
                cobatched = True
            self._stop.wait(self.knobs.token_delay_s)
        if self.busy_count() > 1:
            cobatched = True
        return cobatched

    def _diverge(self, answer: str, prompt_text: str, cobatched: bool, cache_n: int) -> str:
        """The answer as the divergence knobs change it: co-batched, served by one of several
        slots, served from the prompt cache, or by a seeded per-instance draw."""
        knobs = self.knobs
        text = answer
        only = knobs.cobatch_divergence_if_contains
        chosen = not only or any(s in prompt_text for s in only)
        if cobatched and knobs.cobatch_divergence and chosen:
            text = diverged_answer(text)
        by_slot = knobs.slot_divergence_if_contains
        if self.parallel > 1 and any(s in prompt_text for s in by_slot):
            text = diverged_answer(text)
        if cache_n and any(s in prompt_text for s in knobs.cache_divergence_if_contains):
            text = diverged_answer(text)
        if knobs.divergence_probability > 0 and self._draw(prompt_text) < (
            knobs.divergence_probability
        ):
            text = diverged_answer(text)
        flips = cobatched and knobs.cobatch_flip > 0 and self._susceptible(prompt_text)
        if flips and self._draw(f"flip:{prompt_text}") < knobs.cobatch_flip:
            text = diverged_answer(text)
        return text

    def _draw(self, key: str) -> float:
        """A seeded draw for the ``k``-th request of ``key`` on this instance."""
        with self._cond:
            k = self._seen[key] = self._seen.get(key, 0) + 1
        return random.Random(f"{self._noise_key}:{k}:{key}").random()

    def _susceptible(self, prompt_text: str) -> bool:
        """Whether co-batching can change this prompt: one draw per prompt and seed, the same
        on every instance and run."""
        draw = random.Random(f"mock:{self.knobs.seed}:susceptible:{prompt_text}").random()
        return draw < self.knobs.cobatch_susceptible

    def _tokens(self, text: str, cobatched: bool, n_predict: int) -> _Tokens:
        """The text's tokens (split differently when the token-divergence knob applies), cut
        to ``n_predict``."""
        token_only = cobatched and self.knobs.token_divergence and bool(text)
        if token_only:
            pieces = [*resplit(tokenize(text)), "\n"]
            text = "".join(pieces)
        else:
            pieces = tokenize(text)
        finish = "stop"
        if len(pieces) > n_predict:
            pieces = pieces[:n_predict]
            text = "".join(pieces)
            finish = "length"
        return _Tokens(text=text, pieces=tuple(pieces), finish_reason=finish, token_only=token_only)

    def _drift(self, out: _Tokens, cobatched: bool, cache_n: int) -> float:
        """How far the logprobs move: by a token-only split, co-batching, or the prompt cache."""
        drift = 0.05 if out.token_only else 0.0
        if cobatched and not out.token_only:
            drift = self.knobs.numeric_drift
        if cache_n:
            drift += self.knobs.cache_numeric_drift
        return drift


def _logprobs(pieces: tuple[str, ...], drift: float) -> tuple[float, ...]:
    """A fixed logprob per (position, piece), moved down by ``drift``."""
    # An odd divisor: the values carry full float precision, as a real engine's do.
    return tuple(
        -((zlib.crc32(f"{i}:{p}".encode()) % 500) / 9973.0) - drift for i, p in enumerate(pieces)
    )
