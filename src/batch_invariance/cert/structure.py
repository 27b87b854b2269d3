"""Is a cert's evidence one consistent record? (pure)

Re-deriving the verdict from the evidence proves nothing when the evidence itself does not
hold together: a work-set list that is not the ids A ran, a pass recorded twice under one
index, B on ids that are not in the work-set, or one id dispatched twice in a pass (so one
trial overwrote the other in the pass's map). Each of these makes the cert invalid (exit 5),
on the one verification path (:func:`batch_invariance.cert.verify.verify`).

Duplicate keys in the JSON text (a trial map or any object written twice, the later value
silently winning) are caught where the text is parsed (:func:`duplicate_key`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from batch_invariance.cert.schema import Cert


def _repeated(values: Iterable[Any]) -> list[Any]:
    return sorted(value for value, count in Counter(values).items() if count > 1)


def _shown(values: Sequence[Any]) -> str:
    head = ", ".join(map(str, values[:5]))
    return head + (f" (+{len(values) - 5} more)" if len(values) > 5 else "")


def structure_problems(cert: Cert) -> tuple[str, ...]:
    """Every way the embedded evidence fails to be one consistent record (empty = none)."""
    e = cert.evidence
    problems: list[str] = []
    item_ids = [m.test_id for m in e.items]
    items = set(item_ids)
    twice = _repeated(item_ids)
    if twice:
        problems.append(f"evidence.items lists id(s) more than once: {_shown(twice)}")
    if items != set(e.a):
        only_items = sorted(items - set(e.a))
        only_a = sorted(set(e.a) - items)
        problems.append(
            "evidence.items are not the ids arm A ran "
            f"(only in items: {_shown(only_items) or 'none'}; "
            f"only in A: {_shown(only_a) or 'none'})"
        )
    keyed = [m.test_id for m in e.items if m.request_key is not None]
    if keyed and len(keyed) != len(item_ids):
        problems.append(
            f"{len(item_ids) - len(keyed)} of {len(item_ids)} evidence.items carry no "
            "request_key (a cert records one for every item or for none)"
        )
    indices = _repeated(p.index for p in e.c_passes)
    if indices:
        problems.append(f"C pass index(es) recorded more than once: {_shown(indices)}")
    arms: list[tuple[str, Mapping[str, Any] | None]] = [("B", e.b), ("A_repeat", e.a_repeat)]
    arms += [(f"C pass {p.index}", p.trials) for p in e.c_passes]
    for name, trials in arms:
        stray = sorted(set(trials or ()) - items)
        if stray:
            problems.append(f"{name} has trials for id(s) not in evidence.items: {_shown(stray)}")
    for p in e.c_passes:
        again = _repeated(p.order)
        if again:
            problems.append(
                f"C pass {p.index} dispatched id(s) more than once, so one trial overwrote "
                f"another: {_shown(again)}"
            )
        if p.order and set(p.order) != set(p.trials):
            problems.append(f"C pass {p.index}: its dispatch order is not the ids it recorded")
    if e.slot_ctx is not None and e.slot_ctx != cert.ctx:
        problems.append(
            f"evidence.slot_ctx {e.slot_ctx} is not the cert's ctx {cert.ctx}: the sequence "
            "scope was judged against another slot"
        )
    if e.b_ids is not None:
        again = _repeated(e.b_ids)
        if again:
            problems.append(f"evidence.b_ids lists id(s) more than once: {_shown(again)}")
        outside = sorted(set(e.b_ids) - items)
        if outside:
            problems.append(f"evidence.b_ids names id(s) not in evidence.items: {_shown(outside)}")
    return tuple(problems)


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def duplicate_key(text: str | bytes) -> str | None:
    """The first key some JSON object of ``text`` holds twice, or ``None`` (also ``None``
    when ``text`` is not JSON at all: the schema check names that)."""
    try:
        # Numbers stay text: only keys matter here, and converting 500,000 floats costs a
        # third of the scan.
        json.loads(text, object_pairs_hook=_no_duplicates, parse_float=str, parse_int=str)
    except _DuplicateKey as exc:
        return str(exc)
    except (ValueError, RecursionError):
        return None
    return None
