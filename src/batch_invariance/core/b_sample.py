"""Arm B on a seeded sample (pure): what pays for the prompt-cache arm.

B (serial, on the ``--parallel N`` server) is the slot-allocation control. When every C pass
equals A bitwise at every compared position (scored fields, tokens and pre-sampling logprobs,
every id answered with logprobs), B can only turn a GREEN into an AMBER, and a slot-allocation
effect that changes the numerics shows on nearly every row it touches. B then runs on a
seeded sample of :func:`sample_size` ids instead of all of them; any B difference on the
sample still makes the cell AMBER (row 3), and the cert says B ran on a sample
(``evidence.b_ids``, ``provenance.schedule.b_reason``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

from batch_invariance.core.diff import compare
from batch_invariance.core.evidence import PassRecord, Trial
from batch_invariance.core.numerics import compare_pair, has_logprobs

__all__ = ["SAMPLE_MIN", "SAMPLE_SHARE", "bitwise_equal_everywhere", "sample_ids", "sample_size"]

#: B's sample: at least this many ids, and at least this share of the work-set.
SAMPLE_MIN = 8
SAMPLE_SHARE = Fraction(1, 4)


def sample_size(n_items: int) -> int:
    """``min(n, max(SAMPLE_MIN, ceil(n / 4)))``."""
    return min(n_items, max(SAMPLE_MIN, math.ceil(SAMPLE_SHARE * n_items)))


def sample_ids(ids: Sequence[str], seed: int) -> tuple[str, ...]:
    """The seeded sample of ``ids`` (in their own order): the ids with the smallest
    ``sha256(f"{seed}:b-sample:{id}")``, the same on every run and machine."""
    k = sample_size(len(ids))
    rank = sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:b-sample:{i}".encode()).digest())
    chosen = set(rank[:k])
    return tuple(i for i in ids if i in chosen)


def bitwise_equal_everywhere(a: Mapping[str, Trial], passes: Sequence[PassRecord]) -> bool:
    """Every C pass holds every id of A, answered, with logprobs at every token, and equal to
    A in every scored field, in its tokens and in its logprobs, bitwise."""
    if not passes or not a:
        return False
    for p in passes:
        if p.trials.keys() != a.keys():
            return False
        trials = [*a.values(), *p.trials.values()]
        if any(t.is_transport_failure or not has_logprobs(t) for t in trials):
            return False
    maps = [(p.index, p.trials) for p in passes]
    ac = compare("AC", a, maps)
    if not ac.clean or ac.n_token_only:
        return False
    return not compare_pair("AC", a, maps).drift_ids
