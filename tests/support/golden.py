"""Golden files: compare a rendering with its committed file byte for byte
(``BATCH_INVARIANCE_REGEN_GOLDEN=1`` rewrites them from the current output; review their diff
like code)."""

from __future__ import annotations

import os

from tests.support.paths import GOLDEN

#: Set to rewrite the golden files from the current output.
REGEN_ENV = "BATCH_INVARIANCE_REGEN_GOLDEN"


def check_golden(name: str, text: str) -> None:
    """``text`` must equal ``tests/golden/<name>`` byte for byte (:data:`REGEN_ENV` rewrites it)."""
    path = GOLDEN / name
    if os.environ.get(REGEN_ENV):
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"no golden file {path}; run with {REGEN_ENV}=1 to create it"
    assert text == path.read_text(encoding="utf-8"), (
        f"{name} changed; if intended, regenerate with {REGEN_ENV}=1 and review the diff"
    )
