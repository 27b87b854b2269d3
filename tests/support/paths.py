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
