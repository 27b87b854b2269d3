"""What a spark family draws (:class:`Task`), and the drawing helpers the families share.

Everything is decided by the RNG alone, never by the tokenizer or the model.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Letters used in codes (no I or O, which read like digits).
_CODE_LETTERS = "".join(c for c in string.ascii_uppercase if c not in "IO")

_FN_VERBS = ("tally", "fold", "weigh", "stamp", "crank", "sift", "braid", "spool")
_FN_NOUNS = ("quorum", "pellet", "beacon", "spindle", "cinder", "trellis", "gasket", "lintel")


@dataclass(frozen=True)
class Task:
    """What a family contributes to one work item.

    ``needles`` are inserted into the haystack at ``depths`` (fractions, same order).
    ``meta`` holds what the scorer needs and must be plain JSON values.
    """

    needles: tuple[str, ...]
    depths: tuple[float, ...]
    question: str
    expected: str
    meta: Mapping[str, Any] = field(default_factory=dict)


def draw_code(rng: random.Random) -> str:
    letters = "".join(rng.choice(_CODE_LETTERS) for _ in range(4))
    digits = "".join(rng.choice(string.digits) for _ in range(4))
    return f"{letters[:2]}-{digits}-{letters[2:]}"


def draw_depths(rng: random.Random, n: int) -> tuple[float, ...]:
    return tuple(sorted(round(rng.uniform(0.08, 0.92), 3) for _ in range(n)))


def draw_fn_name(rng: random.Random, taken: set[str]) -> str:
    while True:
        name = f"{rng.choice(_FN_VERBS)}_{rng.choice(_FN_NOUNS)}"
        if name not in taken:
            taken.add(name)
            return name


def canonical_json(value: Any) -> str:
    """The canonical JSON text used for expected answers of the JSON families."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def scattered_task(
    rng: random.Random,
    needles: Sequence[str],
    *,
    question: str,
    expected: str,
    meta: Mapping[str, Any],
) -> Task:
    """A task whose needles go into the haystack in a random order, at random depths."""
    order = list(range(len(needles)))
    rng.shuffle(order)
    return Task(
        needles=tuple(needles[i] for i in order),
        depths=draw_depths(rng, len(needles)),
        question=question,
        expected=expected,
        meta=meta,
    )
