"""Golden files: compare a rendering with its committed file (``BI_UPDATE_GOLDEN=1`` rewrites
it; review the diff)."""

from __future__ import annotations

import os

from tests.support.paths import GOLDEN


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("BI_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"{path} missing; run with BI_UPDATE_GOLDEN=1 once"
    assert text == path.read_text(encoding="utf-8")
