"""The ``batch-invariance`` command line.

Each subcommand lives in :mod:`batch_invariance.commands` as a module with
``register(subparsers)``; the handler it sets returns an exit code from
:mod:`batch_invariance.exitcodes`, or a reply that carries one. This module is the only place
errors become exit codes: handlers raise :class:`~batch_invariance.errors.BatchInvarianceError`
kinds and ``main`` prints one line and maps the kind. It is also the one place ``--json`` is
answered (:mod:`batch_invariance.commands.reply`): the handler's reply, or the error's, as one
JSON object on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from batch_invariance import __version__, exitcodes
from batch_invariance.commands.reply import (
    CodeReply,
    ErrorReply,
    error_line,
    exit_code_of,
    json_in_argv,
    json_requested,
    reply_text,
)
from batch_invariance.errors import BatchInvarianceError, UsageError
from batch_invariance.interrupts import install_sigterm, restore_sigterm

#: Subcommand modules, in the order ``--help`` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "demo",
    "run_live",
    "sweep",
    "search",
    "run_mock",
    "verify_cert",
    "plan_n",
    "provision",
    "make_workset",
    "sign",
    "check_deploy",
    "compare",
    "serve",
    "report",
)

#: Options whose value may itself start with ``-`` (``--server-flag -ngl``).
DASH_VALUE_OPTIONS: frozenset[str] = frozenset({"--server-flag"})


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one-line :class:`UsageError`s."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see --help)")


def _glue_dash_values(argv: Sequence[str]) -> list[str]:
    """Rewrite ``--server-flag -ngl`` as ``--server-flag=-ngl`` so argparse accepts it."""
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg in DASH_VALUE_OPTIONS:
            value = next(it, None)
            if value is None:
                out.append(arg)
                break
            out.append(f"{arg}={value}")
        else:
            out.append(arg)
    return out


def command_module(name: str) -> str | None:
    """The module of the subcommand spelled ``name`` (``run-live`` -> ``run_live``), or
    ``None`` for anything that is not a subcommand."""
    module = name.replace("-", "_")
    return module if module in COMMAND_MODULES and "_" not in name else None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` (a subcommand's name) that subcommand alone:
    each command module imports what its options need (``run-live``'s pull in the whole
    live path), so a command registers only itself and starts in a fraction of the time.
    ``--help`` and an unknown command still get every subcommand."""
    parser = _Parser(
        prog="batch-invariance",
        description=(
            "Does continuous batching change what an LLM server answers? Runs the A/B/C gate "
            "for one (model, ctx, N) cell and writes a cert: GREEN, RED, AMBER or UNVERIFIED."
        ),
    )
    parser.add_argument("--version", action="version", version=f"batch-invariance {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    module_name = None if only is None else command_module(only)
    for name in COMMAND_MODULES if module_name is None else (module_name,):
        module = importlib.import_module(f"batch_invariance.commands.{name}")
        module.register(sub)
    return parser


#: Set to show the full traceback of an unexpected error (a bug) instead of one line.
TRACEBACK_ENV = "BATCH_INVARIANCE_TRACEBACK"


def main(argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    """Run the CLI and return its exit code (see :mod:`batch_invariance.exitcodes`).

    ``parser`` defaults to :func:`build_parser` (tests pass their own).
    """
    args_in = list(sys.argv[1:] if argv is None else argv)
    previous = install_sigterm()
    as_json = False
    try:
        if parser is None:
            parser = build_parser(only=args_in[0] if args_in else None)
        tail = None
        if args_in[:1] == ["serve"]:
            from batch_invariance.gate.serve_line import split_neutral

            args_in, tail = split_neutral(args_in)
        words = _glue_dash_values(args_in)
        as_json = json_in_argv(words)  # a usage error from argparse is answered in JSON too
        args = parser.parse_args(words)
        as_json = json_requested(args)
        if tail is not None:
            args.neutral = [*args.neutral, *tail]
        if not as_json:
            return exit_code_of(args.func(args))
        with contextlib.redirect_stdout(sys.stderr):  # stdout holds the one object only
            result = args.func(args)
        reply = CodeReply(result) if isinstance(result, int) else result
        sys.stdout.write(reply_text(reply))
        return exit_code_of(reply)
    except KeyboardInterrupt:
        reply = ErrorReply("interrupted (SIGINT)", "Interrupted", exitcodes.SIGINT)
        return _failed("batch-invariance: interrupted (SIGINT); no cert written", reply, as_json)
    except BatchInvarianceError as exc:
        reply = ErrorReply(str(exc), type(exc).__name__, exitcodes.for_error(exc))
        return _failed(error_line(exc), reply, as_json)
    except Exception as exc:
        # A bug or an unforeseen fault: still one line and the infrastructure code, never a
        # traceback unless asked for. Certs are written atomically, so none is left partial.
        if os.environ.get(TRACEBACK_ENV):
            raise
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        line = (
            f"batch-invariance: unexpected error [{detail}]; rerun with {TRACEBACK_ENV}=1 "
            "for the traceback and report it"
        )
        return _failed(line, ErrorReply(detail, "unexpected", exitcodes.INFRA), as_json)
    finally:
        restore_sigterm(previous)


def _failed(line: str, reply: ErrorReply, as_json: bool) -> int:
    """Report an error: its one line on stderr and, under ``--json``, its object on stdout."""
    print(line, file=sys.stderr)
    if as_json:
        sys.stdout.write(reply_text(reply))
    return reply.exit_code
