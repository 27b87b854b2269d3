"""``--json``: one canonical JSON object on stdout that describes how a command ended.

A command in :data:`JSON_COMMANDS` adds the option with :func:`add_json_option`, and its
handler returns a :class:`Reply` (the exit code and the object) instead of a bare exit code.
``cli.main`` does the rest, in one place for every command: while the handler runs, stdout is
sent to stderr (the human lines never mix with the object), then the reply is printed; an
error becomes an :class:`ErrorReply` beside the one-line message on stderr, with the exit code
it has without ``--json``. The objects: docs/architecture.md ("Machine-readable outcomes").
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from batch_invariance.errors import BatchInvarianceError, Interrupted, PlanUnreachable, UsageError

#: The commands that take ``--json`` (a test checks that each registers it).
JSON_COMMANDS: frozenset[str] = frozenset(
    {"check-deploy", "verify-cert", "run-live", "sweep", "search"}
)

#: Where argparse keeps the option (``compare --json`` is another option, with its own dest).
JSON_DEST = "json_reply"


class Reply(Protocol):
    """How a command ended: its exit code and the object ``--json`` prints."""

    @property
    def exit_code(self) -> int: ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ErrorReply:
    """A run that ended with an error (bad input, infrastructure, a signal)."""

    message: str
    #: The error's kind (``UsageError``, ``InfraError``, ...).
    kind: str
    exit_code: int

    def to_json(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "kind": self.kind, "exit_code": self.exit_code}}


@dataclass(frozen=True)
class CodeReply:
    """A handler that returned only its exit code."""

    exit_code: int

    def to_json(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code}


def add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--json``; ``what`` says what the object describes."""
    parser.add_argument(
        "--json",
        dest=JSON_DEST,
        action="store_true",
        help=f"print one JSON object on stdout: {what} (human lines go to stderr)",
    )


def json_requested(args: argparse.Namespace) -> bool:
    return bool(getattr(args, JSON_DEST, False))


def refuse_json_dry_run(args: argparse.Namespace) -> None:
    """``--json`` describes a finished run; ``--dry-run`` prints a plan and runs nothing."""
    if json_requested(args) and getattr(args, "dry_run", False):
        raise UsageError("--json describes a finished run and --dry-run runs nothing: drop one")


def json_in_argv(argv: Sequence[str]) -> bool:
    """``--json`` on a command that takes it, read before argparse (whose errors come first)."""
    return bool(argv) and argv[0] in JSON_COMMANDS and "--json" in argv[1:]


def reply_text(reply: Reply) -> str:
    """The object, canonical: keys sorted, two-space indent, UTF-8, one trailing newline."""
    data = reply.to_json()
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def exit_code_of(result: int | Reply) -> int:
    return result if isinstance(result, int) else result.exit_code


def error_line(exc: BatchInvarianceError) -> str:
    """The one line an error is reported with on stderr (a plan that cannot reach GREEN: one
    per cause, as its ``--dry-run`` prints them)."""
    if isinstance(exc, Interrupted):
        return f"batch-invariance: {exc}; no cert written"
    if isinstance(exc, PlanUnreachable):
        return "\n".join(f"batch-invariance: {line}" for line in exc.lines())
    return f"batch-invariance: error [{type(exc).__name__}]: {exc}"
