"""Where the tests find the repository's files, named once so a test's depth in tests/ does
not matter."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
GOLDEN = TESTS / "golden"
EXAMPLES = REPO / "examples"
WORKSETS = REPO / "src" / "batch_invariance" / "data" / "worksets"
# Public fixtures (sigstore bundles, runnable action copies) kept beside the repository.
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"

#: Set to rewrite the golden files from the current output (then review their diff like code).
REGEN_ENV = "BATCH_INVARIANCE_REGEN_GOLDEN"


def check_golden(name: str, text: str) -> None:
    """``text`` must equal ``tests/golden/<name>`` byte for byte (:data:`REGEN_ENV` rewrites it)."""
    import os

    path = GOLDEN / name
    if os.environ.get(REGEN_ENV):
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"no golden file {path}; run with {REGEN_ENV}=1 to create it"
    assert text == path.read_text(encoding="utf-8"), (
        f"{name} changed; if intended, regenerate with {REGEN_ENV}=1 and review the diff"
    )
