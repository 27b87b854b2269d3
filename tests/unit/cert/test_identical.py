"""The type-strict equality that lets verification skip serialising a consistent rebuild, and
the guard that it never changes a verification's answer.

Every cert below is verified twice: from its text (where a rebuild identical to the parsed
cert is accepted without serialising either) and as an in-memory cert (always judged on the
JSON forms of both, field by field). Both must give the same problems, verdict and
promotability, for valid certs and for certs edited and re-digested."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from batch_invariance.cert.advice import engine_advice
from batch_invariance.cert.build import rederive_draft
from batch_invariance.cert.identical import identical
from batch_invariance.cert.parse import parse_cert
from batch_invariance.cert.schema import cert_to_json, compute_digest
from batch_invariance.cert.store import render
from batch_invariance.cert.verify import Depth, verify
from tests.support.factories import cert_for, changed, green_evidence, replace_trial


@dataclass(frozen=True)
class _Pair:
    x: Any
    y: Any


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (1, 1, True),
        (1, 1.0, False),
        (1, True, False),
        (0, False, False),
        (1.5, 1.5, True),
        (float("nan"), float("nan"), False),
        (0.0, -0.0, False),  # equal numbers, two JSON texts
        (-0.0, -0.0, True),
        ("a", "a", True),
        (None, None, True),
        (None, 0, False),
        ((1, 2.0), (1, 2.0), True),
        ((1, 2.0), (1, 2), False),
        ((1, 2), [1, 2], False),
        ((1, 2), (1, 2, 3), False),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True),
        ({"a": 1}, {"a": 1.0}, False),
        ({"a": 1}, {"b": 1}, False),
        (_Pair(1, (2.0, "t")), _Pair(1, (2.0, "t")), True),
        (_Pair(1, (2.0, "t")), _Pair(1, (2, "t")), False),
        (_Pair(1, {"k": (True,)}), _Pair(1, {"k": (1,)}), False),
        ({1, 2}, {1, 2}, False),  # not a JSON value: never identical unless the same object
    ],
)
def test_identical_is_equality_with_types(a: Any, b: Any, same: bool) -> None:
    assert identical(a, b) is same
    assert identical(b, a) is same


def test_a_shared_subtree_is_identical_without_a_walk() -> None:
    shared = tuple(float(i) for i in range(1000))
    assert identical(_Pair(shared, 1), _Pair(shared, 1))
    assert not identical(_Pair(shared, 1), _Pair(shared, 1.0))


def _redigested(data: dict[str, Any]) -> str:
    data["digest"] = compute_digest(data)
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False)


def _edit(change: Callable[[dict[str, Any]], None]) -> str:
    cert, _ = cert_for()
    data = cert_to_json(cert)
    change(data)
    return _redigested(data)


def _c0(data: dict[str, Any]) -> dict[str, Any]:
    trials: dict[str, Any] = data["evidence"]["c_passes"][0]["trials"]
    return trials


def _set(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


def _ev() -> Any:
    return green_evidence()


def _token_only() -> str:
    ev = _ev()
    t = ev.c_passes[1].trials["t003"]
    return render(cert_for(replace_trial(ev, "C", "t003", changed(t, completion="x" * 200), 1))[0])


def _red() -> str:
    ev = _ev()
    t = ev.c_passes[0].trials["t001"]
    return render(cert_for(replace_trial(ev, "C", "t001", changed(t, score=0.0)))[0])


def _integer_score() -> str:
    """A score written as ``1`` where the cert wrote ``1.0``: the schema reads it as the
    float, so the digest (over what a reader gets back) still matches."""
    data = cert_to_json(cert_for()[0])
    _c0(data)["t002"]["score"] = 1
    return json.dumps(data, sort_keys=True, indent=2)


VALID: dict[str, Callable[[], str]] = {
    "an integer score": _integer_score,
    "green": lambda: render(cert_for()[0]),
    "mock": lambda: render(cert_for(source="mock")[0]),
    "unverified": lambda: render(cert_for(green_evidence(n_ids=6))[0]),
    "no serial repeat": lambda: render(cert_for(green_evidence(serial_repeat=False))[0]),
    "token only": _token_only,
    "red": _red,
}

EDITED: dict[str, Callable[[], str]] = {
    "status": lambda: _edit(_set(("status",), "failed")),
    "a C score": lambda: _edit(lambda d: _c0(d)["t002"].update(score=0.0)),
    "an excerpt past its length": lambda: _edit(
        lambda d: _c0(d)["t002"].update(completion_excerpt="y" * 200)
    ),
    "a content sha dropped": lambda: _edit(
        lambda d: d["evidence"]["a"]["t002"].update(content_sha256=None)
    ),
    "a cache_n a float cannot hold": lambda: _edit(
        lambda d: d["evidence"]["a"]["t002"].update(cache_n=2**60 + 1)
    ),
    "C passes out of order": lambda: _edit(
        lambda d: d["evidence"].update(c_passes=d["evidence"]["c_passes"][::-1])
    ),
    "items out of order": lambda: _edit(
        lambda d: d["evidence"].update(items=d["evidence"]["items"][::-1])
    ),
    "a report count": lambda: _edit(_set(("divergence_report", "AC", "n_compared"), 31)),
    "a gate reason": lambda: _edit(lambda d: d["gates"]["F1"].update(reason="edited")),
    "the numeric statement": lambda: _edit(lambda d: d["numerics"].update(statement="edited")),
    "the policy": lambda: _edit(lambda d: d["evidence"]["policy"].update(min_hot_trials=1)),
    "a margin": lambda: _edit(lambda d: _c0(d)["t002"]["top_margins"].__setitem__(0, 9.5)),
}


def _both(text: str) -> tuple[Any, Any]:
    from_text = verify(text)
    in_memory = verify(parse_cert(text), Depth.PARSED)
    return from_text, in_memory


def _same_answer(from_text: Any, in_memory: Any) -> None:
    assert from_text.problems == in_memory.problems
    assert (from_text.verdict, from_text.promotable, from_text.promotable_reasons) == (
        in_memory.verdict,
        in_memory.promotable,
        in_memory.promotable_reasons,
    )


@pytest.mark.parametrize("name", sorted(VALID))
def test_a_valid_cert_is_accepted_by_the_identical_rebuild_and_by_its_json(name: str) -> None:
    text = VALID[name]()
    cert = parse_cert(text)
    # The rebuild really is identical (so verification from text skips the JSON forms) ...
    assert identical(replace(rederive_draft(cert, engine_advice), digest=cert.digest), cert)
    from_text, in_memory = _both(text)
    # ... and gives the answer the field-by-field comparison gives.
    assert from_text.valid
    _same_answer(from_text, in_memory)


@pytest.mark.parametrize("name", sorted(EDITED))
def test_an_edited_and_redigested_cert_is_refused_exactly_as_before(name: str) -> None:
    from_text, in_memory = _both(EDITED[name]())
    assert not from_text.valid
    _same_answer(from_text, in_memory)


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("text", ["{not json", "green"])
def test_verification_leaves_the_cyclic_collector_as_it_found_it(enabled: bool, text: str) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        verification = verify(VALID[text]() if text in VALID else text)
        assert verification.valid is (text in VALID)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
