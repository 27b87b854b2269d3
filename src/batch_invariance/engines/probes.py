"""What an engine offers the cell driver to watch it with, and the GETs they are read through.

A :class:`BusyProbe` says how many requests the server is running (the co-batching witness
the dispatcher samples during a C pass); a :class:`PassCounter` is read before and after a
pass (corroboration only). Every engine adapter returns these; the driver (``run/``) and the
launchers (``servers/``) read them. Every GET returns ``None`` on failure instead of raising.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import requests

__all__ = ["BusyProbe", "PassCounter", "as_int", "get_json", "get_text"]


@dataclass(frozen=True)
class BusyProbe:
    """One server-side busy witness the sampler polls: GET ``url``, then ``read`` the body.

    ``kind`` says how the body is decoded (``json`` or Prometheus ``text``); ``read`` returns
    how many requests the server says it is running, or ``None`` when it cannot tell. An engine
    offers zero or more probes; with none, F1 has no server signal and fails closed.
    ``tasks``, where the witness names them, reads the ids of the tasks it saw running.
    """

    label: str
    url: str
    kind: Literal["json", "text"]
    read: Callable[[Any], int | None]
    tasks: Callable[[Any], tuple[int, ...]] | None = None


@dataclass(frozen=True)
class PassCounter:
    """A server-side counter read right before and right after each C pass; the delta is
    recorded next to the pass as corroborating evidence. It never stands in for a busy
    witness: F1 reads only :class:`BusyProbe` counts (fail closed without one).

    ``read`` turns the body at ``url`` into named totals (``None``: not exported)."""

    label: str
    url: str
    read: Callable[[str], Mapping[str, float] | None]


def get_json(session: requests.Session, url: str, timeout_s: float = 2.0) -> Any | None:
    """GET ``url`` and decode JSON; ``None`` on any failure (used by samplers and probes)."""
    try:
        response = session.get(url, timeout=timeout_s)
        if response.status_code != 200:
            return None
        return response.json()
    except (requests.RequestException, ValueError):
        return None


def get_text(session: requests.Session, url: str, timeout_s: float = 2.0) -> str | None:
    """GET ``url`` as text; ``None`` on any failure or non-200 status."""
    try:
        response = session.get(url, timeout=timeout_s)
        if response.status_code != 200:
            return None
        return response.text
    except requests.RequestException:
        return None


def as_int(value: Any) -> int | None:
    """A JSON number that is a whole number, as an ``int`` (a bool is not); else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
