"""Where this tool keeps what it builds and remembers between runs, outside any repository.

``$BATCH_INVARIANCE_CACHE``, else ``$XDG_CACHE_HOME/batch-invariance``, else
``~/.cache/batch-invariance``: the embedded default's binary and model
(:mod:`~batch_invariance.provision.embedded`) and the certs already verified
(:mod:`~batch_invariance.cert.memo`) live under it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["cache_root"]


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """The cache folder (see the module docstring for the precedence)."""
    e = os.environ if env is None else env
    if e.get("BATCH_INVARIANCE_CACHE"):
        return Path(e["BATCH_INVARIANCE_CACHE"]).expanduser()
    if e.get("XDG_CACHE_HOME"):
        return Path(e["XDG_CACHE_HOME"]).expanduser() / "batch-invariance"
    return Path.home() / ".cache" / "batch-invariance"
