"""The version of the decision rules a cert is judged under (pure).

Three versions travel in a cert, each saying something else:

* ``tool_version``: the release of batch-invariance that wrote it (every patch release moves
  it);
* ``cert_version`` (:data:`batch_invariance.cert.schema.CERT_VERSION`): the cert's layout,
  the keys and types of the JSON schema; it bumps when a reader of one layout cannot read the
  other;
* ``rules_version`` (:data:`RULES_VERSION`, here): the decision rules, everything that turns
  the embedded evidence into a verdict, a status or promotability: the verdict rows and
  gates (``core.verdict``, ``core.gates``, ``core.schedule``, ``core.numerics``,
  ``core.scope``, ``core.cache_arm``, ...), the default policy and what counts as looser,
  the promotability rule, the scope gate, the derived fields the re-derivation rebuilds, and
  the cert's structure and identity rules.

A cert verifies, passes its deploy gate and is compared under any tool version with the same
``rules_version`` and ``cert_version``: a release that changes no rule keeps every cert
written before it. Bump :data:`RULES_VERSION` whenever a rule changes; a test re-derives a
fixed corpus of evidence and fails when the verdicts change while this number stays
(``tests/unit/core/test_rules.py``), and CHANGELOG.md names the rules of every release.

A cert written before rules versions were recorded has no ``rules_version``: it holds the
rules of exactly the ``tool_version`` that wrote it, and nothing else re-derives it.
"""

from __future__ import annotations

from typing import Final

__all__ = ["RULES_VERSION", "rules_words"]

#: The decision rules' version. Bump on any change of what the re-derivation rebuilds or
#: the verification decides: a verdict row, gate, default, scope, promotability, structure or
#: identity rule, and the words of a reason too (a cert's reasons are re-derived and compared
#: word for word, so new words would make every earlier cert of these rules invalid).
RULES_VERSION: Final = 1


def rules_words(rules_version: int | None, tool_version: str) -> str:
    """A cert's rules in a few words: ``rules 1``, or for a cert written before the rules
    were versioned, ``unversioned rules of 0.1.0`` (the release whose rules it holds)."""
    if rules_version is None:
        return f"unversioned rules of {tool_version}"
    return f"rules {rules_version}"
