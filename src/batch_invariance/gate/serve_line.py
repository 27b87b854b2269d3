"""A ``batch-invariance serve ...`` line read as ``serve`` itself reads it: serve's command
line as data (:data:`SERVE_OPTIONS`, from which ``commands/serve.py`` builds its argparse
parser), the cert or certs folder it names and the words after its ``--``. One reading for the
``serve`` command and for check-deploy, which reads a serve line as the server that line
starts (:mod:`batch_invariance.gate.served`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from batch_invariance.cert.option_table import POLICY_OPTIONS, Option
from batch_invariance.errors import UsageError


class ServeRefused(UsageError):
    """``serve`` will not start this: the message names what (nothing was started)."""


#: ``serve``'s command line as data: argparse is built from it in ``commands/serve.py``, and
#: :func:`parse_serve_line` reads a serve line of a deploy file from it.
SERVE_OPTIONS: tuple[Option, ...] = (
    Option("cert", "positional", "the promotable cert to serve (or --certs)", "CERT"),
    Option("--certs", "path", "a folder of certs: serve the engine command after -- with the "
           "cert in it that measured exactly that command (instead of CERT)", "DIR"),
    Option("--bundle", "path", "its sigstore bundle (default: CERT.sigstore.json beside it)", "B"),
    *POLICY_OPTIONS,
    Option("neutral", "rest", "after --: with CERT, neutral llama-server options to add or "
           "replace (--host, --port, --api-key, --metrics, --timeout ...); with --certs, the "
           "engine's own command (-- llama-server -m MODEL -c 4096 -np 4 -ub 1 ...)",
           "-- WORDS"),
)  # fmt: skip


def split_neutral(words: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """``serve``'s own words and the llama-server options after its ``--`` (argparse cannot
    give a trailing positional list after a positional CERT and options)."""
    if "--" not in words:
        return list(words), None
    cut = list(words).index("--")
    return list(words[:cut]), list(words[cut + 1 :])


def is_serve(argv: Sequence[str]) -> bool:
    """``argv`` runs ``batch-invariance serve`` (by name; what the program is is checked by
    content: :func:`batch_invariance.gate.identity.is_this_tool`)."""
    return (
        len(argv) > 1 and PurePosixPath(argv[0]).name == "batch-invariance" and argv[1] == "serve"
    )


@dataclass(frozen=True)
class ServeLine:
    """A serve command line: the pinned ``cert`` with its neutral options, or the ``certs``
    folder with the engine command after ``--``; ``options``: serve's own options as given."""

    cert: Path | None
    neutral: tuple[str, ...]
    certs: Path | None = None
    options: tuple[tuple[str, str], ...] = ()


def serve_target(cert: Path | None, certs: Path | None) -> None:
    """Exactly one of CERT and ``--certs`` names what to serve (argparse cannot say so for an
    optional positional)."""
    if (cert is None) == (certs is None):
        raise ServeRefused(
            "serve takes either CERT (one pinned cert, neutral options after --) or --certs DIR "
            "(the engine command after --, served with the cert in DIR that measured it)"
        )


def parse_serve_line(argv: Sequence[str], base_dir: Path | None, origin: str) -> ServeLine:
    """A ``batch-invariance serve ...`` command line as ``serve`` itself parses it (its
    argparse parser, built from :data:`SERVE_OPTIONS`, accepts exactly what this does)."""
    own, tail = split_neutral(argv[2:])
    read = _read_words(own, SERVE_OPTIONS)
    if read is None:
        raise ServeRefused(f"{origin}: serve would refuse this command line")
    positionals, options = read

    def located(word: str) -> Path:
        path = Path(word)
        return path if path.is_absolute() or base_dir is None else base_dir / path

    certs = options.get("--certs")
    cert = located(positionals[0]) if positionals else None
    try:
        serve_target(cert, None if certs is None else located(certs))
    except ServeRefused as exc:
        raise ServeRefused(f"{origin}: {exc}") from None
    return ServeLine(
        cert, (*positionals[1:], *(tail or ())), None if certs is None else located(certs),
        tuple(sorted(options.items())),
    )  # fmt: skip


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _option_like(word: str) -> bool:
    """What argparse reads as an option, not a value (no option here looks like a number)."""
    return (
        word.startswith("-")
        and word != "-"
        and not _NEGATIVE_NUMBER.match(word)
        and (" " not in word or word.split("=", 1)[0].startswith("--"))
    )


def _named(word: str, table: Sequence[Option]) -> Option | None:
    """The option ``word`` (before any ``=``) names, exactly or as a unique prefix."""
    flags = [o for o in table if o.name.startswith("--")]
    exact = [o for o in flags if o.name == word]
    prefixed = [o for o in flags if o.name.startswith(word)]
    found = exact or prefixed
    return found[0] if len(found) == 1 else None


def _read_words(
    words: Sequence[str], table: Sequence[Option]
) -> tuple[list[str], dict[str, str]] | None:
    """The positional words of ``words`` and each option's value (``""`` for a flag) read by
    ``table`` as argparse reads them (options anywhere, ``--flag=value``, unique prefixes, one
    group member at most, the positionals in one run), or ``None`` where argparse would refuse
    the line."""
    positionals: list[str] = []
    values: dict[str, str] = {}
    runs, seen, index = 0, set[str](), 0
    while index < len(words):
        word = words[index]
        if not _option_like(word):
            run_end = index
            while run_end < len(words) and not _option_like(words[run_end]):
                run_end += 1
            runs += 1
            if runs > 1:  # a second run: the positionals were already consumed
                return None
            positionals.extend(words[index:run_end])
            index = run_end
            continue
        name, eq, value = word.partition("=")
        option = _named(name, table)
        if option is None or (option.kind == "flag" and eq):
            return None
        if option.kind != "flag" and not eq:
            index += 1
            if index >= len(words) or _option_like(words[index]):
                return None
            value = words[index]
        values[option.name] = value
        group = [o.name for o in table if o.group is not None and o.group == option.group]
        if any(other in seen and other != option.name for other in group):
            return None
        seen.add(option.name)
        index += 1
    return positionals, values
