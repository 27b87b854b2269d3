"""SGLang (``sglang.launch_server``): adapter tested against a protocol fake; not yet run against a
real engine.

N concurrent sequences is ``--max-running-requests N``, the context ``--context-length C``, the
radix (prefix) cache is off (``--disable-radix-cache``) and metrics are on. A user's
``--enable-deterministic-inference`` is passed through and recorded. The busy witness is the
``sglang:num_running_reqs`` gauge; cache evidence is ``sglang:cache_hit_rate``.
"""

from __future__ import annotations

from typing import Any

from batch_invariance.engines.base import CacheEvidence, Engine, LaunchCommand, LaunchRequest
from batch_invariance.engines.probes import BusyProbe
from batch_invariance.engines.witness import counters, gauge_probe

BUSY_GAUGE = "sglang:num_running_reqs"
CACHE_HIT_RATE = "sglang:cache_hit_rate"
DETERMINISTIC_FLAG = "--enable-deterministic-inference"


class SglangEngine(Engine):
    """``python -m sglang.launch_server --model-path M --max-running-requests N ...``.

    ``server_bin`` is the Python interpreter that has SGLang installed.
    """

    name = "sglang"
    cobatches = True
    #: ``--model-path`` is a Hugging Face model folder (or hub id): no GGUF header to read.
    loads_gguf = False
    owned_flags: frozenset[str] = frozenset(
        {"--model-path", "--max-running-requests", "--context-length", "--host", "--port",
         "--disable-radix-cache", "--enable-metrics"}
    )  # fmt: skip
    #: What turns its prompt cache off in a deploy (a verdict's reason words the fix).
    cache_off_advice = "--disable-radix-cache"
    refused_flags: frozenset[str] = frozenset({"--enable-hierarchical-cache"})
    argv_names = ("--model-path", "--max-running-requests", "--context-length")

    def launch_command(self, r: LaunchRequest) -> LaunchCommand:
        # The prompt-cache arm runs SGLang as a deploy does: its radix (prefix) cache on.
        radix = () if r.prompt_cache else ("--disable-radix-cache",)
        argv = (
            str(r.server_bin), "-m", "sglang.launch_server", "--model-path", str(r.model),
            "--max-running-requests", str(r.parallel), "--context-length", str(r.ctx),
            *radix, "--enable-metrics", "--host", r.host, "--port", str(r.port),
            *r.extra_flags,
        )  # fmt: skip
        return LaunchCommand(argv, {}, "/health")

    def busy_probes(self, base_url: str, metrics_url: str | None = None) -> tuple[BusyProbe, ...]:
        url = metrics_url or base_url.rstrip("/") + "/metrics"
        return (gauge_probe("sglang-metrics", url, BUSY_GAUGE),)

    def cache_evidence(self, metrics_text: str | None) -> CacheEvidence:
        if metrics_text is None:
            return CacheEvidence({}, None)
        found = counters(metrics_text, (CACHE_HIT_RATE,))
        rate = found.get(CACHE_HIT_RATE)
        return CacheEvidence(found, None if rate is None else rate > 0)

    def provenance(self, command: LaunchCommand) -> dict[str, Any]:
        return {
            "engine": self.name,
            "deterministic_inference": DETERMINISTIC_FLAG in command.argv,
            "busy_witness": BUSY_GAUGE,
            "verified_against": "protocol fake only",
        }
