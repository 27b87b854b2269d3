"""What the engines started as ``python -m ...`` (llama-cpp-python, vLLM, SGLang) share.

``server_bin`` is the Python interpreter of a venv that has the engine installed; it is kept as
given (a venv's interpreter is a symlink whose own path makes it that venv). They take no
``--kv-layout`` (one layout: the engine's own), report no slot count, take no profile, and their
flags are not llama.cpp's, so the memory projection assumes the default KV cache types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from batch_invariance.engines.base import KvLayout, MemoryReservation, PromptCache

__all__ = ["PythonModuleEngine"]


class PythonModuleEngine:
    """The shared answers; each engine adds its name, flags, argv and witnesses."""

    name: str
    cobatches: bool
    kv_layouts: frozenset[KvLayout] = frozenset({"split"})
    reports_slots = False
    ctx_multiple = 1
    takes_profiles = False

    @property
    def binary_hint(self) -> str:
        return f"{self.name} launcher"

    def resolve_binary(self, server_bin: Path) -> Path:
        return server_bin.absolute()

    def kv_label(self, ctx: int, parallel: int, layout: KvLayout) -> str:
        if not self.cobatches:
            return f"{self.name}:one-context:{ctx} (serves one request at a time)"
        return f"{self.name}:{parallel} seqs x {ctx} tokens"

    def guard_flags(self, flags: Sequence[str]) -> tuple[str, ...]:
        return ()

    def unknown_flags(self, flags: Sequence[str]) -> tuple[str, ...]:
        return ()

    def memory_reservation(
        self, flags: Sequence[str], env: Mapping[str, str]
    ) -> MemoryReservation | None:
        return None

    def prompt_cache_bytes(self, cache: PromptCache) -> int | None:
        # Their prompt caches (prefix caching, radix cache) live in the KV cache itself.
        return 0
