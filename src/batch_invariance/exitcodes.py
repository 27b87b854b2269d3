"""The one table that maps outcomes to process exit codes.

=====  ==========================================================
code   meaning
=====  ==========================================================
0      GREEN and promotable
1      RED: batching changed scored outputs
2      usage or configuration error, or a refused guard (nothing ran)
3      AMBER, UNVERIFIED, or otherwise not promotable (serve: not the measured cell)
4      infrastructure failure with no verdict
5      cert invalid: schema, digest, version, re-derived verdict, identity or signature
130    interrupted by SIGINT
143    interrupted by SIGTERM
=====  ==========================================================
"""

from __future__ import annotations

import signal

from batch_invariance.errors import (
    BatchInvarianceError,
    CertInvalid,
    GuardRefused,
    InfraError,
    Interrupted,
    NotCovered,
    UsageError,
)

PROMOTABLE = 0
RED = 1
USAGE = 2
NOT_PROMOTABLE = 3
INFRA = 4
CERT_INVALID = 5
SIGINT = 128 + int(signal.SIGINT)
SIGTERM = 128 + int(signal.SIGTERM)

_ERROR_CODES: tuple[tuple[type[BatchInvarianceError], int], ...] = (
    (UsageError, USAGE),
    (GuardRefused, USAGE),
    (InfraError, INFRA),
    (CertInvalid, CERT_INVALID),
    (NotCovered, NOT_PROMOTABLE),
)


def for_error(exc: BatchInvarianceError) -> int:
    """Exit code for an error kind; unknown kinds count as infrastructure failures."""
    if isinstance(exc, Interrupted):
        return 128 + exc.signum
    for kind, code in _ERROR_CODES:
        if isinstance(exc, kind):
            return code
    return INFRA


def for_status(status: str, promotable: bool) -> int:
    """Exit code for a cert's verdict: 0 only when it is promotable, 1 for RED, else 3."""
    if status == "failed":
        return RED
    if promotable:
        return PROMOTABLE
    return NOT_PROMOTABLE


def for_comparison(comparable: bool, worst: str | None) -> int:
    """Exit code of ``compare`` by the worst class: 1 a scored field changed, 2 not comparable
    (nothing compared), 0 every prompt identical, 3 anything between (drift, tokens changed,
    logprobs missing, a prompt with no answer to judge)."""
    if worst == "scored":
        return RED
    if not comparable:
        return USAGE
    if worst == "identical":
        return PROMOTABLE
    return NOT_PROMOTABLE


def for_policy(comparable: bool, failed: bool) -> int:
    """Exit code of ``compare --fail-on``: 2 not comparable, 1 the policy failed, else 0."""
    if not comparable:
        return USAGE
    return RED if failed else PROMOTABLE
