"""How a live cell's servers are launched (:class:`LaunchOptions`): one value from the command
line (or the Action) through the request and the job to the launcher."""

from __future__ import annotations

from dataclasses import dataclass

from batch_invariance.core.plan import NumberRule, number_field
from batch_invariance.engines.base import KvLayout, PromptCache

__all__ = ["DEFAULT_READY_TIMEOUT", "LaunchOptions"]

DEFAULT_READY_TIMEOUT = 300.0


@dataclass(frozen=True)
class LaunchOptions:
    """How a live cell's servers are launched (what a launcher needs besides the target): one
    value from the command line (or the Action) through the job to the launcher."""

    #: Seconds a server may take to become ready.
    ready_timeout: float = number_field(NumberRule(0, exclusive=True), DEFAULT_READY_TIMEOUT)
    #: The memory cap (GiB) the guard holds a projected server to.
    max_footprint_gb: float | None = number_field(NumberRule(0, exclusive=True), None)
    #: KV layout of the B/C server: split (every slot owns ctx) or unified (one ctx*N pool).
    kv_layout: KvLayout = "split"
    #: The ``--cache-ram`` (MiB) under test on the prompt-cache arm's server; ``None``: the
    #: server's own default.
    cache_ram: int | None = number_field(NumberRule(0), None)

    @property
    def prompt_cache(self) -> PromptCache:
        """How the prompt-cache arm's server runs its cache (when the arm runs)."""
        return PromptCache(self.cache_ram)
