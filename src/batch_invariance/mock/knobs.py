"""The mock's value types: its fault knobs, one request's output, server-side truth, refusal."""

from __future__ import annotations

from dataclasses import dataclass, field

#: The chat template the mock reports by default: a model that carries its own.
MOCK_CHAT_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"


@dataclass(frozen=True)
class MockKnobs:
    """Faults and timing of the mock. The defaults give a well-behaved, batch-invariant server."""

    #: Score-bearing change of content when another slot was busy during generation.
    cobatch_divergence: bool = False
    #: When set, ``cobatch_divergence`` changes only prompts containing one of these.
    cobatch_divergence_if_contains: tuple[str, ...] = ()
    #: Prompts containing one of these change on any server with more than one slot, serial
    #: or not: slot allocation itself changes outputs (B and C differ from A alike).
    slot_divergence_if_contains: tuple[str, ...] = ()
    #: Same answer, different tokens and logprobs when co-batched (a trailing newline and a
    #: different split), so the invariant fields stay equal.
    token_divergence: bool = False
    #: Same tokens and answer, but the logprobs move by ``numeric_drift`` when co-batched:
    #: the latent numeric drift a batch-variant server shows before any token flips.
    numeric_drift: float = 0.0
    #: On a server with its prompt cache on (the prompt-cache arm's), a request that reused
    #: cached prompt tokens gets logprobs moved by this (same tokens and answer): the drift
    #: the prompt cache alone causes.
    cache_numeric_drift: float = 0.0
    #: Prompts containing one of these change their answer when served from the cache.
    cache_divergence_if_contains: tuple[str, ...] = ()
    #: A share of prompts susceptible to co-batching (drawn per prompt from ``seed`` and the
    #: prompt, the same on every server), each co-batched run of one changing its answer with
    #: probability ``cobatch_flip`` (drawn per run): the cells of the power model,
    #: ``core/power.py`` (``s`` and ``f``). A flip of 0 changes nothing.
    cobatch_susceptible: float = 1.0
    cobatch_flip: float = 0.0
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
    #: Prompts containing one of these are answered HTTP 500 the first time this server is
    #: asked for them, and answered normally after (a live server's transient fault).
    fail_once_if_contains: tuple[str, ...] = ()
    #: The model's own chat template; ``None`` plays a base model without one: ``/props``
    #: then reports llama.cpp's ChatML fallback, as llama-server does.
    chat_template: str | None = MOCK_CHAT_TEMPLATE
    seed: int = 0


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
    #: Prompt tokens reused from the cache (``timings.cache_n``).
    cache_n: int = 0


@dataclass
class MockStats:
    """Server-side truth, for tests: how many requests, how many slots busy at most."""

    requests: int = 0
    max_busy: int = 0
    cobatched: int = 0
    #: The prompts of the co-batched requests (the power model counts distinct ones).
    cobatched_prompts: set[str] = field(default_factory=set)
    refused: int = 0
    task_ids: list[int] = field(default_factory=list)


class Busy(Exception):
    """Refused under load (the http-errors knob), or the server stopped while waiting."""
