"""Protocol fakes for vLLM and SGLang: their HTTP surface over the mock's real slots.

Each fake speaks what its engine documents and the tool relies on: ``/health``, ``/v1/models``,
the OpenAI ``/v1/completions`` and ``/v1/chat/completions`` shapes (no llama.cpp ``timings``,
no ``id_slot``), FastAPI's 404 for llama.cpp-only paths (``/slots``, ``/props``,
``/completion``, ``/tokenize``), the OpenAI-style error object, and Prometheus text on
``/metrics`` with the engine's busy gauge and cache counters. ``witness=False`` serves
``/metrics`` without the busy gauge (a build or flag that does not export it).
vLLM's ``vllm:iteration_tokens_total`` histogram advances with the requests served
(``histogram=False`` / ``$FAKE_ENGINE_HISTOGRAM=0`` leaves it out).
``$FAKE_ENGINE_WITNESS=0`` and ``$FAKE_ENGINE_KNOBS`` (JSON of :class:`MockKnobs` fields) set
the same for the stand-in executable.

Run as a script (``python tests/support/engine_fakes.py -m vllm.entrypoints.openai.api_server
--model M --max-num-seqs N ... --port P``) it is a stand-in executable for the engine's own
command line: it checks the flags the adapter must pass, writes what it was started with to
``$FAKE_ENGINE_RECORD``, and serves until SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from batch_invariance.mock import MockKnobs, MockServer
from batch_invariance.mock.http import MockHandler

_LLAMA_ONLY = ("/slots", "/props", "/completion", "/tokenize")


def _openai_error(status: int, message: str) -> dict[str, Any]:
    kind = "BadRequestError" if status < 500 else "ServiceUnavailableError"
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


class _OpenAIEngineHandler(MockHandler):
    """What vLLM and SGLang have in common (their OpenAI-compatible FastAPI servers)."""

    engine = "openai"
    witness = True

    def metrics_body(self) -> str:
        raise NotImplementedError

    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        if isinstance(payload, dict):
            if isinstance(payload.get("error"), dict):
                payload = _openai_error(status, str(payload["error"].get("message", "")))
            else:
                payload = {k: v for k, v in payload.items() if k not in ("timings", "id_slot")}
                payload["model"] = "fake-model"
        super()._send(status, payload, content_type)

    def _path(self) -> str:
        return self.path.split("?", 1)[0]

    def do_GET(self) -> None:
        path = self._path()
        if path in _LLAMA_ONLY:
            super()._send(404, {"detail": "Not Found"})
        elif path == "/health":
            super()._send(200, "", "text/plain")
        elif path == "/v1/models":
            super()._send(200, {"object": "list", "data": [{"id": "fake-model"}]})
        elif path == "/metrics":
            super()._send(200, self.metrics_body(), "text/plain; version=0.0.4")
        else:
            super()._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if self._path() in _LLAMA_ONLY:
            super()._send(404, {"detail": "Not Found"})
            return
        super().do_POST()


class VllmHandler(_OpenAIEngineHandler):
    engine = "vllm"

    def metrics_body(self) -> str:
        labels = 'engine="0",model_name="fake-model"'
        busy = self.mock.busy_count()
        lines = [
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} 0.0",
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of tokens.",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{{{labels}}} {float(self.mock.stats.requests * 7)}",
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of tokens.",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{{{labels}}} 0.0",
            "# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.",
            "# TYPE vllm:iteration_tokens_total histogram",
            *self.iteration_histogram(labels),
        ]
        if self.witness:
            lines[0:0] = [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{labels}}} {float(busy)}",
            ]
        return "\n".join(lines) + "\n"

    #: ``$FAKE_ENGINE_HISTOGRAM=0`` (or ``histogram = False``): a build without the histogram.
    histogram = True
    #: Engine steps each request adds to the histogram (a fixed stand-in for its tokens).
    STEPS_PER_REQUEST = 4

    def iteration_histogram(self, labels: str) -> list[str]:
        """``vllm:iteration_tokens_total`` advancing with the requests served: a request that
        ran alone adds steps of one token, one that was co-batched steps of up to 8 tokens."""
        if not self.histogram:
            return []
        stats = self.mock.stats
        alone = self.STEPS_PER_REQUEST * (stats.requests - stats.cobatched)
        together = self.STEPS_PER_REQUEST * stats.cobatched
        name = "vllm:iteration_tokens_total"
        return [
            f'{name}_bucket{{{labels},le="1.0"}} {float(alone)}',
            f'{name}_bucket{{{labels},le="8.0"}} {float(alone + together)}',
            f'{name}_bucket{{{labels},le="+Inf"}} {float(alone + together)}',
            f"{name}_count{{{labels}}} {float(alone + together)}",
            f"{name}_sum{{{labels}}} {float(alone + 8 * together)}",
        ]


class SglangHandler(_OpenAIEngineHandler):
    engine = "sglang"

    def metrics_body(self) -> str:
        labels = 'model_name="fake-model",tp_rank="0"'
        lines = [
            "# HELP sglang:num_queue_reqs The number of requests in the waiting queue",
            "# TYPE sglang:num_queue_reqs gauge",
            f"sglang:num_queue_reqs{{{labels}}} 0.0",
            "# HELP sglang:cache_hit_rate The prefix cache hit rate",
            "# TYPE sglang:cache_hit_rate gauge",
            f"sglang:cache_hit_rate{{{labels}}} 0.0",
        ]
        if self.witness:
            lines += [
                "# HELP sglang:num_running_reqs The number of running requests",
                "# TYPE sglang:num_running_reqs gauge",
                f"sglang:num_running_reqs{{{labels}}} {float(self.mock.busy_count())}",
            ]
        return "\n".join(lines) + "\n"


def handler_for(engine: str, witness: bool = True, histogram: bool = True) -> type[MockHandler]:
    """The fake surface of ``engine`` (``vllm`` or ``sglang``)."""
    base = {"vllm": VllmHandler, "sglang": SglangHandler}[engine]
    return type(f"{base.__name__}Served", (base,), {"witness": witness, "histogram": histogram})


def fake_engine(
    engine: str,
    parallel: int,
    ctx: int = 2048,
    knobs: MockKnobs | None = None,
    *,
    port: int = 0,
    witness: bool = True,
    histogram: bool = True,
) -> MockServer:
    """A loopback fake of ``engine`` with ``parallel`` real slots (use as a context manager)."""
    handler = handler_for(engine, witness, histogram)
    return MockServer(parallel, ctx, knobs, port=port, handler=handler)


# ----- the stand-in executable ----------------------------------------------------------------


def _value(argv: list[str], flag: str) -> str:
    if flag not in argv:
        raise SystemExit(f"fake engine: missing {flag} in {argv}")
    return argv[argv.index(flag) + 1]


def _parse(argv: list[str]) -> tuple[str, int, int, int]:
    """(engine, parallel, ctx, port) from the engine's own command line; exits when the adapter
    left out a flag the engine needs for an honest measurement."""
    if argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"]:
        for flag in ("--no-enable-prefix-caching", "--enable-prompt-tokens-details", "--model"):
            if flag not in argv:
                raise SystemExit(f"fake vllm: {flag} missing")
        return (
            "vllm",
            int(_value(argv, "--max-num-seqs")),
            int(_value(argv, "--max-model-len")),
            int(_value(argv, "--port")),
        )
    if argv[:2] == ["-m", "sglang.launch_server"]:
        for flag in ("--disable-radix-cache", "--enable-metrics"):
            if flag not in argv:
                raise SystemExit(f"fake sglang: {flag} missing")
        return (
            "sglang",
            int(_value(argv, "--max-running-requests")),
            int(_value(argv, "--context-length")),
            int(_value(argv, "--port")),
        )
    raise SystemExit(f"fake engine: unknown command line {argv}")


def main(argv: list[str]) -> None:
    engine, parallel, ctx, port = _parse(argv)
    record = os.environ.get("FAKE_ENGINE_RECORD")
    if record:
        env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "SGLANG_"))}
        with Path(record).open("a") as out:
            out.write(json.dumps({"argv": argv, "env": env}) + "\n")
    witness = os.environ.get("FAKE_ENGINE_WITNESS", "1") == "1"
    histogram = os.environ.get("FAKE_ENGINE_HISTOGRAM", "1") == "1"
    knobs = MockKnobs(**json.loads(os.environ.get("FAKE_ENGINE_KNOBS", "{}")))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with fake_engine(engine, parallel, ctx, knobs, port=port, witness=witness, histogram=histogram):
        stop.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
