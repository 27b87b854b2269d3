"""The one file-hash helper: a file's sha256, and a cache of it keyed by size and mtime.

Model files, server binaries, sdists and converted folders are all identified this way.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["cached_sha256", "sha256_file"]


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks (the one file-hash helper)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_sha256(path: str | Path, cache_file: Path | None) -> str:
    """sha256 of ``path``, reusing a cached value while its size and mtime are unchanged.

    ``cache_file`` is a small JSON map; ``None`` disables caching. A corrupt or unwritable
    cache only costs a re-hash, never an error.
    """
    p = Path(path).resolve()
    st = p.stat()
    key = str(p)
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    table: dict[str, Any] = {}
    if cache_file is not None:
        try:
            loaded = json.loads(cache_file.read_text())
            if isinstance(loaded, dict):
                table = loaded
        except (OSError, ValueError):
            table = {}
        entry = table.get(key)
        if (
            isinstance(entry, dict)
            and entry.get("size") == stamp["size"]
            and entry.get("mtime_ns") == stamp["mtime_ns"]
            and isinstance(entry.get("sha256"), str)
        ):
            return str(entry["sha256"])
    digest = sha256_file(p)
    if cache_file is not None:
        table[key] = {**stamp, "sha256": digest}
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(table, sort_keys=True))
            os.replace(tmp, cache_file)
        except OSError:
            pass
    return digest
