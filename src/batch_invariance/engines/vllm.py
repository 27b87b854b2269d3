"""vLLM (``vllm serve``): adapter tested against a protocol fake; not yet run against a real engine.

N concurrent sequences is ``--max-num-seqs N``, the context is ``--max-model-len C``, and
automatic prefix caching is turned off (``--no-enable-prefix-caching``). ``VLLM_BATCH_INVARIANT``
is passed through from the environment and recorded. The busy witness is the
``vllm:num_requests_running`` gauge on ``/metrics``; cache evidence is the prefix-cache
hit/query counters (older releases prefix them ``gpu_``).
"""

from __future__ import annotations

from typing import Any

from batch_invariance.engines.base import (
    CacheEvidence,
    LaunchCommand,
    LaunchRequest,
    passthrough_env,
)
from batch_invariance.engines.witness import counters, gauge_probe, step_totals_reader
from batch_invariance.run.dispatch import BusyProbe, PassCounter

BUSY_GAUGE = "vllm:num_requests_running"
#: Tokens per engine step; its per-pass change is recorded where present (a step of more
#: than one decode token is itself a sign of co-batching, but prefill steps make it no
#: witness on its own: it corroborates the busy gauge, it never replaces it for F1).
ITERATION_HISTOGRAM = "vllm:iteration_tokens_total"
CACHE_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
CACHE_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
NUMERICS_ENV = ("VLLM_BATCH_INVARIANT",)


class VllmEngine:
    """``vllm serve M --max-num-seqs N --max-model-len C --no-enable-prefix-caching``."""

    name = "vllm"
    cobatches = True
    #: ``vllm serve`` takes a Hugging Face model folder (or hub id): no GGUF header to read.
    loads_gguf = False
    owned_flags: frozenset[str] = frozenset(
        {"--max-num-seqs", "--max-model-len", "--host", "--port", "--no-enable-prefix-caching"}
    )
    refused_flags: frozenset[str] = frozenset({"--enable-prefix-caching"})

    def launch_command(self, r: LaunchRequest) -> LaunchCommand:
        argv = (
            str(r.server_bin), "serve", str(r.model),
            "--max-num-seqs", str(r.parallel), "--max-model-len", str(r.ctx),
            "--no-enable-prefix-caching", "--host", r.host, "--port", str(r.port),
            *r.extra_flags,
        )  # fmt: skip
        return LaunchCommand(argv, passthrough_env(NUMERICS_ENV, r.env), "/health")

    def busy_probes(self, base_url: str, metrics_url: str | None = None) -> tuple[BusyProbe, ...]:
        url = metrics_url or base_url.rstrip("/") + "/metrics"
        return (gauge_probe("vllm-metrics", url, BUSY_GAUGE),)

    def pass_counters(
        self, base_url: str, metrics_url: str | None = None
    ) -> tuple[PassCounter, ...]:
        url = metrics_url or base_url.rstrip("/") + "/metrics"
        return (PassCounter("vllm-iteration-tokens", url, step_totals_reader(ITERATION_HISTOGRAM)),)

    def cache_evidence(self, metrics_text: str | None) -> CacheEvidence:
        if metrics_text is None:
            return CacheEvidence({}, None)
        found = counters(metrics_text, (*CACHE_HITS, *CACHE_QUERIES))
        hits = [found[n] for n in CACHE_HITS if n in found]
        return CacheEvidence(found, (sum(hits) > 0) if hits else None)

    def provenance(self, command: LaunchCommand) -> dict[str, Any]:
        return {
            "engine": self.name,
            "numerics_env": dict(command.env),
            "batch_invariant_mode": command.env.get("VLLM_BATCH_INVARIANT") == "1",
            "busy_witness": BUSY_GAUGE,
            "corroboration": f"{ITERATION_HISTOGRAM} per C pass, where exported (not read by F1)",
            "verified_against": "protocol fake only",
        }
