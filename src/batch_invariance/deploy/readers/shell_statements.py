"""A deploy script's tokens grouped into simple statements (pure).

A statement is words and redirections ended by a newline, ``;`` or ``&`` (background),
optionally followed by ``|| exit [N]``. Every other operator (``&&``, ``|``, ``(``, here-documents,
``<<<``, ``>|``) is outside the grammar. In the sh dialect ``&>`` and ``&>>`` are too: dash reads
``cmd &> f`` as ``cmd &`` then ``> f``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from batch_invariance.deploy.readers.shell_dialect import Dialect
from batch_invariance.deploy.readers.shell_expand import NotInGrammar
from batch_invariance.deploy.readers.shell_words import Op, Token, Word
from batch_invariance.deploy.readers.source_bytes import is_decimal

_REDIRECTIONS = frozenset({">", ">>", "&>", "&>>", ">&", "<"})
_BASH_ONLY = frozenset({"&>", "&>>"})


@dataclass(frozen=True)
class Statement:
    words: list[Word]
    redirects: list[tuple[str, Word]]
    background: bool
    #: The ``exit [N]`` after ``||`` (``None``: no ``||``).
    or_exit: list[Word] | None
    line: int


def _descriptor(word: Word) -> bool:
    """An unquoted number right before a redirection operator (``2>``): a descriptor."""
    parts = word.parts
    return len(parts) == 1 and not parts[0].quoted and is_decimal(parts[0].text)


def statements(tokens: Sequence[Token], dialect: Dialect) -> list[Statement | NotInGrammar]:
    out: list[Statement | NotInGrammar] = []
    current: list[Token] = []
    for token in [*tokens, Op("\n", -1, -1)]:
        if isinstance(token, Op) and token.text in ("\n", ";", "&"):
            if current:
                out.append(_statement(current, token.text == "&", dialect))
            elif token.text != "\n":
                out.append(
                    NotInGrammar(f"{token.text!r} with no command before it", "", token.line)
                )
            current = []
        else:
            current.append(token)
    return out


def _statement(tokens: list[Token], background: bool, dialect: Dialect) -> Statement | NotInGrammar:
    found = _parse(tokens, background, dialect)
    if isinstance(found, NotInGrammar):
        found.line = found.line or tokens[0].line
    return found


def _parse(tokens: list[Token], background: bool, dialect: Dialect) -> Statement | NotInGrammar:
    line = tokens[0].line
    words: list[Word] = []
    redirects: list[tuple[str, Word]] = []
    or_exit: list[Word] | None = None
    target: list[Word] = words
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if isinstance(token, Word):
            target.append(token)
        elif token.text == "||" and or_exit is None and words:
            or_exit = []
            target = or_exit
        elif token.text in _BASH_ONLY and dialect == "sh":
            return NotInGrammar(
                f"{token.text} in an sh script (dash runs cmd {token.text} FILE as cmd & "
                f"then {token.text[1:]} FILE)",
                f"write {token.text[1:]} FILE 2>&1",
                token.line,
            )
        elif token.text in _REDIRECTIONS:
            fd = ""
            if target and target[-1].end == token.start and _descriptor(target[-1]):
                fd = target.pop().literal or ""
                if len(fd) > 1:
                    return NotInGrammar(
                        f"descriptor {fd} (dash reads only 0-9: {fd} would be an argument)"
                    )
            nxt = tokens[index + 1] if index + 1 < len(tokens) else None
            if not isinstance(nxt, Word):
                return NotInGrammar(f"redirection {token.text} without a target")
            redirects.append((fd + token.text, nxt))
            index += 1
        else:
            what = "a here-document" if token.text.startswith("<<") else f"operator {token.text}"
            return NotInGrammar(what, "one simple command per line")
        index += 1
    if or_exit is not None and (
        not or_exit or or_exit[0].literal != "exit" or len(or_exit) > 2 or background
    ):
        return NotInGrammar("|| followed by something other than exit [N]")
    if not words:
        return NotInGrammar("a redirection with no command")
    return Statement(words, redirects, background, or_exit, line)


__all__ = ["Statement", "statements"]
