"""CHANGELOG.md names the rules of every release: an entry for the current version (and
``Unreleased`` on top when there is one), each with one ``Rules:`` line that agrees with
``RULES_VERSION`` and with the entries below it, so a bump of the rules or of the version
without a changelog line fails here."""

from __future__ import annotations

import itertools
import re

import pytest

from batch_invariance import __version__
from batch_invariance.core.rules import RULES_VERSION
from tests.support.paths import REPO

CHANGELOG = REPO / "CHANGELOG.md"
_ENTRY = re.compile(r"^## (\S+)\s*$", re.MULTILINE)
_RULES = re.compile(r"^Rules: (first|unchanged|changed) \(rules (\d+)\)\s*$", re.MULTILINE)


def entries(text: str) -> list[tuple[str, str, int]]:
    """(heading, kind, rules) per entry, top first; raises ValueError on an entry whose
    ``Rules:`` line is missing, doubled or malformed."""
    heads = list(_ENTRY.finditer(text))
    out: list[tuple[str, str, int]] = []
    for k, head in enumerate(heads):
        body = text[head.end() : heads[k + 1].start() if k + 1 < len(heads) else len(text)]
        lines = _RULES.findall(body)
        if len(lines) != 1:
            raise ValueError(
                f"CHANGELOG.md: entry {head.group(1)} needs exactly one line "
                "'Rules: unchanged|changed|first (rules N)'"
            )
        kind, number = lines[0]
        out.append((head.group(1), kind, int(number)))
    return out


def problems(text: str, version: str, rules: int) -> list[str]:
    """Everything wrong with ``text`` as the changelog of ``version`` under ``rules``."""
    try:
        found = entries(text)
    except ValueError as exc:
        return [str(exc)]
    names = [name for name, _, _ in found]
    out: list[str] = []
    if version not in names:
        out.append(f"CHANGELOG.md has no entry '## {version}' for the current version")
    if not found or found[0][0] not in ("Unreleased", version):
        out.append(f"CHANGELOG.md: the top entry must be '## Unreleased' or '## {version}'")
    elif found[0][2] != rules:
        out.append(
            f"CHANGELOG.md: the top entry ({found[0][0]}) names rules {found[0][2]}, but "
            f"RULES_VERSION is {rules}: say what changed ('Rules: changed (rules {rules})')"
        )
    if names.count("Unreleased") > 1 or "Unreleased" in names[1:]:
        out.append("CHANGELOG.md: 'Unreleased' is one entry, on top")
    for (name, kind, number), (below, _, was) in itertools.pairwise(found):
        if kind == "first":
            out.append(f"CHANGELOG.md: {name} says 'first' but {below} is older")
        elif kind == "unchanged" and number != was:
            out.append(f"CHANGELOG.md: {name} says rules unchanged but {below} had rules {was}")
        elif kind == "changed" and number <= was:
            out.append(f"CHANGELOG.md: {name} says rules changed but keeps rules {number}")
    if found and found[-1][1] != "first":
        out.append(f"CHANGELOG.md: the oldest entry ({found[-1][0]}) says 'Rules: first (...)'")
    return out


def test_the_changelog_names_this_version_and_these_rules() -> None:
    assert problems(CHANGELOG.read_text(encoding="utf-8"), __version__, RULES_VERSION) == []


_GOOD = """# Changelog
## Unreleased
Rules: changed (rules 2)
## 0.2.0
Rules: unchanged (rules 1)
## 0.1.0
Rules: first (rules 1)
"""


@pytest.mark.parametrize(
    ("text", "version", "rules", "needle"),
    [
        (_GOOD, "0.2.0", 2, None),
        (_GOOD, "0.2.1", 2, "no entry '## 0.2.1'"),
        (_GOOD, "0.2.0", 3, "names rules 2, but RULES_VERSION is 3"),
        (_GOOD.replace("changed (rules 2)", "unchanged (rules 2)"), "0.2.0", 2, "unchanged"),
        (_GOOD.replace("changed (rules 2)", "changed (rules 1)"), "0.2.0", 1, "keeps rules 1"),
        (_GOOD.replace("Rules: unchanged (rules 1)\n", ""), "0.2.0", 2, "exactly one line"),
        (_GOOD.replace("## Unreleased", "## 0.3.0"), "0.2.0", 2, "top entry must be"),
    ],
)
def test_the_check_fails_on_each_missing_or_wrong_line(
    text: str, version: str, rules: int, needle: str | None
) -> None:
    found = problems(text, version, rules)
    if needle is None:
        assert found == []
    else:
        assert any(needle in p for p in found), found
