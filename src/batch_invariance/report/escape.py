"""Text that is safe where the runner or a Markdown renderer reads it: workflow-command
escapes (``::error::``, their ``title=`` property, plain job-log lines) and Markdown escapes
(table cells, code spans) for any value that comes from the step's inputs or a cert. Pure.

:mod:`batch_invariance.report.render` re-exports every name here, with the views built on them.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = [
    "EXCERPT_CHARS",
    "annotation",
    "escape_data",
    "escape_property",
    "log_line",
    "md_cell",
    "md_code",
    "one_line",
]

#: How long a value from an input or a cert may grow in a summary line before it is cut.
EXCERPT_CHARS = 80


def escape_data(text: str) -> str:
    """Escape a workflow-command message (``::error::MESSAGE``): ``%``, CR and LF, as the
    runner unescapes them, so a value can neither end the line nor start a command."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a workflow-command property value (``title=...``): the message's escapes, and
    ``:`` and ``,``, which would end the value."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(level: Literal["error", "warning", "notice"], title: str, message: str) -> str:
    return f"::{level} title={escape_property(title)}::{escape_data(message)}"


def log_line(text: str) -> str:
    """A plain job-log line that echoes values from the step's inputs or a cert: on one line
    (CR and LF written as ``\\r`` and ``\\n``), so no value can start a line the runner reads
    as a workflow command (``::error::``)."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


#: Characters that start Markdown or HTML anywhere in a line: backslash escapes, code spans,
#: emphasis, strikethrough, links and images, HTML tags and autolinks, entities, table cells
#: and GitHub's math. Each is written with a backslash (CommonMark: any ASCII punctuation may
#: be), so it shows as itself.
_MD_INLINE = re.compile(r"([\\`*_~\[\]<|&$])")
#: What starts a block when it begins a line: a heading, a quote, a list item, a setext
#: underline or a thematic break (its first character), an ordered list item (``1.``, ``1)``).
_MD_BLOCK = re.compile(r"^([#>+=-]|[0-9]{1,9}(?=[.)]))")


def one_line(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``value`` on one line (whitespace runs as one space), cut to ``limit`` characters."""
    text = " ".join(str(value).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def md_cell(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``value`` as Markdown text that shows exactly as written: on one line, cut to ``limit``
    characters, every Markdown and HTML metacharacter escaped (safe in a table cell, a list
    item or a line of its own). For any value from the step's inputs or a cert."""
    text = one_line(value, limit)
    if not text:
        return "∅"
    text = _MD_INLINE.sub(r"\\\1", text)
    block = _MD_BLOCK.match(text)
    if block is None:
        return text
    at = block.end() if block.group(1)[0].isdigit() else 0
    return text[:at] + "\\" + text[at:]


def md_code(value: object, limit: int = EXCERPT_CHARS, *, table: bool = False) -> str:
    """``value`` for the inside of a code span (`` `...` ``), where Markdown and HTML are
    already literal: on one line, cut to ``limit``, a backtick (which would end the span)
    written as ``'``, and in a table cell ``|`` escaped (GFM splits cells before spans)."""
    text = one_line(value, limit).replace("`", "'") or "∅"
    return text.replace("|", "\\|") if table else text
