"""argparse built from an option table (:mod:`batch_invariance.cert.option_table`): the only
place a table becomes a parser."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batch_invariance.cert.option_table import POLICY_OPTIONS, Option

__all__ = ["add_options", "add_policy_arguments"]


def add_options(parser: argparse.ArgumentParser, table: Sequence[Option]) -> None:
    """Add every option of ``table`` to ``parser``, in order."""
    groups: dict[str, Any] = {}
    for option in table:
        target: Any = parser
        if option.group is not None:
            if option.group not in groups:
                groups[option.group] = parser.add_mutually_exclusive_group()
            target = groups[option.group]
        if option.kind == "positional":
            # Optional: the command decides which of its positionals and options are required.
            target.add_argument(
                option.dest, type=Path, nargs="?", metavar=option.metavar, help=option.help
            )
        elif option.kind == "rest":
            target.add_argument(option.dest, nargs="*", metavar=option.metavar, help=option.help)
        elif option.kind == "flag":
            target.add_argument(option.name, action="store_true", help=option.help)
        else:
            kind = Path if option.kind == "path" else str
            target.add_argument(
                option.name, type=kind, default=None, metavar=option.metavar, help=option.help
            )


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The identity policy options (check-deploy's, serve's, compare's and run-live's), read
    by :func:`~batch_invariance.cert.signing_policy.signing_policy`."""
    add_options(parser, POLICY_OPTIONS)
