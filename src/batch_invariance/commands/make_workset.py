"""`batch-invariance make-workset` (not built yet: registers nothing)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: "argparse._SubParsersAction[Any]") -> None:
    """Placeholder until this command is built."""
