"""The closed grammar of a deploy shell script: the words, variables and operators the reader
models completely (pure). The statements are in :mod:`batch_invariance.deploy.readers.shell`.

A word may hold, unquoted, only the characters of :data:`UNQUOTED`; anything quoted (single
quotes, double quotes, a backslash) except control characters; and ``$NAME`` / ``${NAME}`` of a
variable the file itself set. So no pathname, brace or tilde expansion can apply, and
no ``$(...)``, backticks, ``${X:-y}``, ``$1``, ``$'...'``, ``$"..."``.
"""

from __future__ import annotations

import re

from batch_invariance.deploy.readers.shell_words import Word

#: Characters a word may hold unquoted (``#`` only inside a word: at its start it is a comment).
UNQUOTED = re.compile(r"[A-Za-z0-9_./:=,@%+#-]*")
#: Characters that start pathname expansion when an unquoted expansion's value holds them.
GLOB = re.compile(r"[*?\[]")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

#: Variables bash itself reads or sets (bash(1), "Shell Variables"): assigning one changes the
#: shell, not only a value. Outside the grammar, except the ones modelled (:data:`MODELLED`).
BASH_VARIABLES = frozenset(
    {
        "BASH",
        "BASHOPTS",
        "BASHPID",
        "BASH_ALIASES",
        "BASH_ARGC",
        "BASH_ARGV",
        "BASH_ARGV0",
        "BASH_CMDS",
        "BASH_COMMAND",
        "BASH_COMPAT",
        "BASH_ENV",
        "BASH_EXECUTION_STRING",
        "BASH_LINENO",
        "BASH_LOADABLES_PATH",
        "BASH_MONOSECONDS",
        "BASH_REMATCH",
        "BASH_SOURCE",
        "BASH_SUBSHELL",
        "BASH_TRAPSIG",
        "BASH_VERSINFO",
        "BASH_VERSION",
        "BASH_XTRACEFD",
        "CDPATH",
        "CHILD_MAX",
        "COLUMNS",
        "COMP_CWORD",
        "COMP_KEY",
        "COMP_LINE",
        "COMP_POINT",
        "COMP_TYPE",
        "COMP_WORDBREAKS",
        "COMP_WORDS",
        "COMPREPLY",
        "COPROC",
        "DIRSTACK",
        "EMACS",
        "ENV",
        "EPOCHREALTIME",
        "EPOCHSECONDS",
        "EUID",
        "EXECIGNORE",
        "FCEDIT",
        "FIGNORE",
        "FUNCNAME",
        "FUNCNEST",
        "GLOBIGNORE",
        "GLOBSORT",
        "GROUPS",
        "HISTCMD",
        "HISTCONTROL",
        "HISTFILE",
        "HISTFILESIZE",
        "HISTIGNORE",
        "HISTSIZE",
        "HISTTIMEFORMAT",
        "HOSTFILE",
        "HOSTNAME",
        "HOSTTYPE",
        "IFS",
        "IGNOREEOF",
        "INPUTRC",
        "INSIDE_EMACS",
        "LINENO",
        "LINES",
        "MACHTYPE",
        "MAIL",
        "MAILCHECK",
        "MAILPATH",
        "OLDPWD",
        "OPTARG",
        "OPTERR",
        "OPTIND",
        "OSTYPE",
        "PIPESTATUS",
        "POSIXLY_CORRECT",
        "PPID",
        "PROMPT_COMMAND",
        "PROMPT_DIRTRIM",
        "PS0",
        "PS1",
        "PS2",
        "PS3",
        "PS4",
        "PWD",
        "RANDOM",
        "READLINE_ARGUMENT",
        "READLINE_LINE",
        "READLINE_MARK",
        "READLINE_POINT",
        "REPLY",
        "SECONDS",
        "SHELL",
        "SHELLOPTS",
        "SHLVL",
        "SRANDOM",
        "TIMEFORMAT",
        "TMOUT",
        "UID",
        "_",
    }
)
#: bash variables whose effect on the shell is modelled: ``PATH`` (command lookup; it must be
#: a list of absolute folders), and ones that change nothing the grammar allows
#: (``HOME``: tilde and a bare ``cd`` are outside it; ``LANG``/``LC_*``/``TZ``/``TMPDIR``).
MODELLED = frozenset({"PATH", "HOME", "LANG", "TZ", "TMPDIR"})


def assignable(name: str) -> bool:
    """A variable the grammar lets a script assign."""
    if name in MODELLED or name.startswith("LC_"):
        return True
    return name not in BASH_VARIABLES and not name.startswith("BASH_")


def word_problem(word: Word) -> str | None:
    """Why a word is outside the grammar (``None``: inside)."""
    if word.problem:
        return word.problem
    if len(word.parts) == 1 and word.parts[0].text in ("[", "]") and not word.parts[0].variable:
        return None  # the test command and its last word: no pattern without both brackets
    for part in word.parts:
        if part.variable:
            continue
        if CONTROL.search(part.text) or "\n" in part.text:
            return "a control character or newline inside a word"
        if not part.quoted and not UNQUOTED.fullmatch(part.text):
            bad = next(c for c in part.text if not UNQUOTED.fullmatch(c))
            return f"unquoted {bad!r} (bash would expand or treat it specially; quote the word)"
    return None
