"""The output-changing server options an engine declares for ``batch-invariance search``.

A :class:`SearchConfig` is one point of that space: server flags added to the cell's own,
the KV layout, and engine variables (vLLM's batch-invariant mode is a variable, not a flag).
Every engine's space opens with :data:`DEFAULT_CONFIG`, the engine as it starts with nothing
added: the search's positive control, and what every other point's throughput is set
against. The engine owns its list (:attr:`~batch_invariance.engines.base.Engine.search_space`);
the search walks it and measures each point through the same driver as ``run-live``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_CONFIG", "DEFAULT_SPACE", "SearchConfig"]


@dataclass(frozen=True)
class SearchConfig:
    """One configuration: its short name, the flags it adds, its KV layout and variables."""

    name: str
    flags: tuple[str, ...] = ()
    #: As :data:`~batch_invariance.engines.base.KvLayout` (that module imports this one).
    kv_layout: Literal["split", "unified"] = "split"
    #: Engine variables the servers get, as ``(NAME, value)`` pairs.
    env: tuple[tuple[str, str], ...] = ()

    @property
    def slug(self) -> str:
        """The folder name its certs go in (letters, digits, ``-`` and ``_`` only)."""
        return re.sub(r"[^A-Za-z0-9_-]+", "_", self.name).strip("_") or "config"

    @property
    def is_defaults(self) -> bool:
        return not self.flags and self.kv_layout == "split" and not self.env

    def words(self) -> str:
        """The configuration as an operator reads it: its flags, layout and variables."""
        said = list(self.flags)
        if self.kv_layout != "split":
            said.append(f"kv={self.kv_layout}")
        said += [f"{k}={v}" for k, v in self.env]
        return " ".join(said) if said else "(defaults)"


#: The engine with nothing added: the positive control of every search.
DEFAULT_CONFIG = SearchConfig("defaults")
#: The space of an engine that declares no options of its own: its defaults alone.
DEFAULT_SPACE: tuple[SearchConfig, ...] = (DEFAULT_CONFIG,)
