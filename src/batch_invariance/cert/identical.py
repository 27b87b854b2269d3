"""Type-strict equality of two cert value trees (pure).

:func:`identical` says whether two values (frozen dataclasses, tuples, lists, dicts, strings,
numbers, booleans, ``None``) are equal *with their types*: ``1``, ``1.0`` and ``True`` are
three different values here, as they are three different JSON texts. Two identical trees of
one schema dump to the same JSON, so a rebuilt cert identical to the stored one cannot
disagree with it in any field; :func:`batch_invariance.cert.verify.verify` uses that to
skip serialising both when they agree, and falls back to comparing their JSON forms field by
field when they do not.

Shared subtrees (the same object on both sides, as the embedded tokens and logprobs of a
rebuilt cert are) are identical without a walk, which is what makes this cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass
from math import copysign
from operator import attrgetter, is_
from typing import Any

__all__ = ["identical"]

#: Per dataclass type, a getter of all its field values as one tuple (read in C).
_FIELD_GETTERS: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def _field_values(a: Any) -> tuple[Any, ...]:
    kind = type(a)
    getter = _FIELD_GETTERS.get(kind)
    if getter is None:
        names = [f.name for f in fields(a)]
        one = attrgetter(*names)
        # attrgetter of one name returns the value itself, not a 1-tuple.
        getter = (lambda x: (one(x),)) if len(names) == 1 else one
        _FIELD_GETTERS[kind] = getter
    return getter(a)


def _all_identical(xs: tuple[Any, ...] | list[Any], ys: tuple[Any, ...] | list[Any]) -> bool:
    """Same length and identical element by element; shared elements are checked in C."""
    if len(xs) != len(ys):
        return False
    if all(map(is_, xs, ys)):
        return True
    return all(map(identical, xs, ys))


def identical(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are equal and of the same type all the way down. NaN is never
    identical to anything (not even itself unless it is the same object): when in doubt,
    the caller takes the slow path, never a wrong answer."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is tuple or kind is list:
        return _all_identical(a, b)
    if kind is dict:
        return a.keys() == b.keys() and all(identical(v, b[k]) for k, v in a.items())
    if kind in _FIELD_GETTERS or is_dataclass(a):
        return _all_identical(_field_values(a), _field_values(b))
    if kind is float:
        # 0.0 and -0.0 are equal numbers but two JSON texts: the sign must agree too.
        return bool(a == b) and copysign(1.0, a) == copysign(1.0, b)
    if kind in (str, int, bool) or a is None:
        return bool(a == b)
    # Anything else (a NamedTuple, a set, an object of another kind): equal only if the
    # same object, which was checked above. Unknown is not identical.
    return False
