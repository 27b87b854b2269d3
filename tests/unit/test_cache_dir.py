"""Where the tool keeps what it builds and remembers."""

from __future__ import annotations

from pathlib import Path

from batch_invariance.cache_dir import cache_root


def test_cache_root_precedence(tmp_path: Path) -> None:
    env = {"BATCH_INVARIANCE_CACHE": str(tmp_path / "a"), "XDG_CACHE_HOME": str(tmp_path / "x")}
    assert cache_root(env) == tmp_path / "a"
    assert cache_root({"XDG_CACHE_HOME": str(tmp_path / "x")}) == (
        tmp_path / "x" / "batch-invariance"
    )
    assert cache_root({}) == Path.home() / ".cache" / "batch-invariance"
