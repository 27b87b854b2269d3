"""llama.cpp's ``llama-server`` as an :class:`~batch_invariance.engines.base.Engine`.

The launch itself stays in :mod:`batch_invariance.servers.llama_server` (memory guard, split KV
cache, ``--slots``, ``--cache-ram 0``); this adapter names the same facts for the engine layer:
its argv, its witnesses (``/slots`` and the ``llamacpp:requests_processing`` gauge) and its
cache evidence (per-response ``timings.cache_n``, which the transport reads).
"""

from __future__ import annotations

from typing import Any

from batch_invariance.core import llama_flags
from batch_invariance.engines.base import CacheEvidence, LaunchCommand, LaunchRequest
from batch_invariance.run.dispatch import BusyProbe, PassCounter, llama_server_probes
from batch_invariance.servers import llama_server


class LlamaServerEngine:
    """``llama-server --parallel N --ctx-size C*N --no-kv-unified --slots --metrics ...``."""

    name = "llama-server"
    cobatches = True
    #: Its ``--model`` is one GGUF file (header read, memory guard applied).
    loads_gguf = True
    #: The one llama-server flag reader's lists (core.llama_flags).
    owned_flags: frozenset[str] = llama_flags.OWNED_FLAGS
    refused_flags: frozenset[str] = llama_flags.REFUSED_FLAGS

    def launch_command(self, r: LaunchRequest) -> LaunchCommand:
        argv = llama_server.build_argv(
            r.server_bin, r.model, host=r.host, port=r.port, parallel=r.parallel, ctx=r.ctx,
            metrics=True, extra_flags=r.extra_flags,
        )  # fmt: skip
        return LaunchCommand(argv, {}, "/health")

    def busy_probes(self, base_url: str, metrics_url: str | None = None) -> tuple[BusyProbe, ...]:
        return llama_server_probes(base_url, metrics_enabled=True, metrics_url=metrics_url)

    def pass_counters(
        self, base_url: str, metrics_url: str | None = None
    ) -> tuple[PassCounter, ...]:
        return ()

    def cache_evidence(self, metrics_text: str | None) -> CacheEvidence:
        # Per-response timings.cache_n is the evidence here (the prompt_cache gate reads it).
        return CacheEvidence({}, None)

    def provenance(self, command: LaunchCommand) -> dict[str, Any]:
        return {"engine": self.name, "busy_witness": "/slots + llamacpp:requests_processing"}
