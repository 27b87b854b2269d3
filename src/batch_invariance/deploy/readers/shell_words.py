"""Splitting a shell script into words and operators the way bash and dash do (pure).

Blanks are space and tab only (a CR is part of a word, as in both shells; the readers refuse
it before this, with every byte outside :mod:`batch_invariance.deploy.readers.source_bytes`).

Only what a deploy script needs is modelled: quotes, backslashes, line continuations,
comments (a ``#`` that starts a word; a ``\\`` at the end of a comment continues nothing),
``$NAME`` / ``${NAME}`` expansions, operators, redirections and here-documents (their body is
skipped). Anything else a word holds (``$(...)``, backticks, ``${X:-y}``, ``$1``, ``$'...'``,
``$"..."``) is kept as a *problem* of that word: the reader fails closed on a command that has one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from batch_invariance.deploy.readers.source_bytes import BLANKS
from batch_invariance.errors import UsageError

_OPERATORS = (
    "&>>", "<<<", "<<-", ";;", "&&", "||", "|&", ">>", "<<", "&>", ">&", "<&", ">|",
    ";", "&", "|", "(", ")", "<", ">",
)  # fmt: skip
#: Operators that take the next word as their target (a file, a descriptor, a delimiter).
REDIRECTS = frozenset({"&>>", "<<<", "<<-", ">>", "<<", "&>", ">&", "<&", ">|", "<", ">"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: A run of characters that mean only themselves unquoted (read as one piece, not one by one).
_PLAIN = re.compile(r"[^\\\n \t;&|()<>'\"$`]+")
#: A run of characters that mean only themselves inside double quotes.
_QUOTED_PLAIN = re.compile(r'[^"\\$`]+')
#: The word after ``<<`` on its line (blanks before it skipped).
_DELIMITER = re.compile(r"[ \t]*([^ \t\n]+)")


@dataclass(frozen=True)
class Part:
    """A piece of a word: literal text or a variable, quoted or not."""

    text: str
    quoted: bool
    variable: bool = False


@dataclass
class Word:
    parts: list[Part] = field(default_factory=list)
    line: int = 0
    start: int = 0
    end: int = 0
    #: What the reader does not model in this word (``command substitution $(...)``).
    problem: str | None = None

    @property
    def literal(self) -> str | None:
        """The word's text when it has no expansion at all (quotes removed)."""
        if any(p.variable for p in self.parts):
            return None
        return "".join(p.text for p in self.parts)

    @property
    def source(self) -> str:
        return "".join("$" + p.text if p.variable else p.text for p in self.parts)


@dataclass(frozen=True)
class Op:
    text: str
    line: int
    start: int


Token = Word | Op


def _closing(text: str, i: int, opener: str, closer: str) -> int:
    """Index just past the ``closer`` that balances the ``opener`` at ``i``."""
    depth = 0
    while i < len(text):
        if text[i] == opener:
            depth += 1
        elif text[i] == closer:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


class _Lexer:
    def __init__(self, text: str, name: str) -> None:
        self.text = text
        self.name = name
        self.i = 0
        self.line = 1
        self.tokens: list[Token] = []
        self.word: Word | None = None
        #: The text of the word's last literal part, in pieces (joined once, when the part
        #: ends: appending to a string would copy it each time, quadratic in a long word).
        self.pending: list[str] = []
        self.pending_quoted = False
        self.heredocs: list[tuple[str, bool]] = []
        #: Lines of here-document bodies (number, text): skipped as commands.
        self.heredoc_lines: list[tuple[int, str]] = []

    def _append(self, part: Part) -> None:
        word = self._word()
        if self.pending and not part.variable and self.pending_quoted == part.quoted:
            self.pending.append(part.text)  # the same literal part goes on
            return
        self._settle(word)
        if part.variable:
            word.parts.append(part)
        else:
            self.pending, self.pending_quoted = [part.text], part.quoted

    def _settle(self, word: Word) -> None:
        """The pending literal part joined onto the word."""
        if self.pending:
            word.parts.append(Part("".join(self.pending), self.pending_quoted))
            self.pending = []

    def _word(self) -> Word:
        if self.word is None:
            self.word = Word(line=self.line, start=self.i)
        return self.word

    def _flush(self) -> None:
        if self.word is not None:
            self._settle(self.word)
            self.word.end = self.i
            self.tokens.append(self.word)
            self.word = None

    def _problem(self, what: str) -> None:
        word = self._word()
        word.problem = word.problem or what

    def _dollar(self, quoted: bool) -> None:
        text, i = self.text, self.i
        nxt = text[i + 1] if i + 1 < len(text) else ""
        if nxt == "(":
            self._problem("command substitution $(...)")
            self.i = _closing(text, i + 1, "(", ")")
        elif nxt == "{":
            end = _closing(text, i + 1, "{", "}")
            inner = text[i + 2 : end - 1]
            if _NAME.fullmatch(inner):
                self._append(Part(inner, quoted, variable=True))
            else:
                self._problem(f"parameter expansion ${{{inner}}}")
            self.i = end
        elif nxt == "'" and not quoted:
            self._problem("ANSI-C quoting $'...'")
            end = text.find("'", i + 2)
            self.i = len(text) if end < 0 else end + 1
        elif nxt == '"' and not quoted:
            # bash translates $"..." with the locale; dash reads a $ and a quoted string.
            self._problem('locale quoting $"..." (bash and sh read it differently)')
            self.i += 1
        elif match := _NAME.match(text, i + 1):
            self._append(Part(match.group(0), quoted, variable=True))
            self.i = match.end()
        elif nxt and nxt in "0123456789@*#?$!-":
            self._problem(f"special parameter ${nxt}")
            self.i += 2
        else:
            self._append(Part("$", quoted))
            self.i += 1

    def _backticks(self) -> None:
        self._problem("command substitution `...`")
        end = self.text.find("`", self.i + 1)
        self.i = len(self.text) if end < 0 else end + 1

    def _double_quoted(self) -> None:
        text = self.text
        self.i += 1
        self._word()
        while self.i < len(text) and text[self.i] != '"':
            char = text[self.i]
            if char == "\\" and self.i + 1 < len(text) and text[self.i + 1] in '$`"\\\n':
                if text[self.i + 1] == "\n":
                    self.line += 1
                else:
                    self._append(Part(text[self.i + 1], True))
                self.i += 2
            elif char == "$":
                self._dollar(quoted=True)
            elif char == "`":
                self._backticks()
            else:
                match = _QUOTED_PLAIN.match(text, self.i)
                chunk = match.group(0) if match else char
                self.line += chunk.count("\n")
                self._append(Part(chunk, True))
                self.i += len(chunk)
        if self.i >= len(text):
            raise UsageError(f"{self.name}:{self.line}: unterminated double quote")
        self.i += 1

    def _skip_heredoc_bodies(self) -> None:
        text = self.text
        for delimiter, strip_tabs in self.heredocs:
            while self.i <= len(text):  # a line starts at i (at len(text): the empty last one)
                end = text.find("\n", self.i)
                end = len(text) if end < 0 else end
                body = text[self.i : end].lstrip("\t") if strip_tabs else text[self.i : end]
                self.i, self.line = end + 1, self.line + 1
                if body == delimiter:
                    break
                self.heredoc_lines.append((self.line - 1, body))
        self.heredocs = []

    def run(self) -> list[Token]:
        text = self.text
        while self.i < len(text):
            char = text[self.i]
            if char == "\\" and text[self.i + 1 : self.i + 2] == "\n":
                self.i += 2
                self.line += 1
            elif char == "\n":
                self._flush()
                self.tokens.append(Op("\n", self.line, self.i))
                self.i += 1
                self.line += 1
                if self.heredocs:
                    self._skip_heredoc_bodies()
            elif char in BLANKS:
                self._flush()
                self.i += 1
            elif char == "#" and self.word is None:
                end = text.find("\n", self.i)
                self.i = len(text) if end < 0 else end
            elif char in ";&|()<>":
                self._operator()
            elif char == "'":
                end = text.find("'", self.i + 1)
                if end < 0:
                    raise UsageError(f"{self.name}:{self.line}: unterminated single quote")
                chunk = text[self.i + 1 : end]
                self._append(Part(chunk, True))
                self.line += chunk.count("\n")
                self.i = end + 1
            elif char == '"':
                self._double_quoted()
            elif char == "\\":
                self._append(Part(text[self.i + 1 : self.i + 2], True))
                self.i += 2
            elif char == "$":
                self._dollar(quoted=False)
            elif char == "`":
                self._backticks()
            else:
                match = _PLAIN.match(text, self.i)
                chunk = match.group(0) if match else char
                self._append(Part(chunk, False))
                self.i += len(chunk)
        self._flush()
        return self.tokens

    def _operator(self) -> None:
        self._flush()
        op = next(o for o in _OPERATORS if self.text.startswith(o, self.i))
        self.tokens.append(Op(op, self.line, self.i))
        self.i += len(op)
        if op in ("<<", "<<-"):
            # The delimiter: the next word on the line (not the rest of the line split, which
            # was quadratic in a line of thousands of <<).
            delimiter = _DELIMITER.match(self.text, self.i)
            if delimiter is not None:
                self.heredocs.append((delimiter.group(1).strip("'\""), op == "<<-"))


@dataclass(frozen=True)
class Script:
    tokens: list[Token]
    #: Lines of here-document bodies (number, text): data, not commands.
    heredoc_lines: list[tuple[int, str]]


def tokenize(text: str, name: str) -> Script:
    """Words and operators of a whole script; newlines are ``Op("\\n")``."""
    lexer = _Lexer(text, name)
    return Script(lexer.run(), lexer.heredoc_lines)
