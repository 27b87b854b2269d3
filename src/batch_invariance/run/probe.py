"""GETs of llama-server's read-only endpoints, and the busy witness read from them.

``/slots`` and ``/metrics`` say how many requests the server is processing at once (the
co-batching witness the dispatcher samples); the launchers read ``/v1/models``, ``/props``
and ``/metrics`` through the same GETs. Every GET returns ``None`` on failure instead of raising.
"""

from __future__ import annotations

from typing import Any

import requests

from batch_invariance.core.prometheus import metric_total, parse_prometheus
from batch_invariance.run.response import as_int

__all__ = [
    "busy_from_metrics",
    "busy_from_slots",
    "get_json",
    "get_text",
    "server_chat_template",
    "tasks_from_slots",
]


def get_json(session: requests.Session, url: str, timeout_s: float = 2.0) -> Any | None:
    """GET ``url`` and decode JSON; ``None`` on any failure (used by samplers and probes)."""
    try:
        response = session.get(url, timeout=timeout_s)
        if response.status_code != 200:
            return None
        return response.json()
    except (requests.RequestException, ValueError):
        return None


def server_chat_template(base_url: str) -> str | None:
    """The chat template the server applies (``/props`` ``chat_template``); ``None`` unknown."""
    with requests.Session() as session:
        props = get_json(session, base_url.rstrip("/") + "/props")
    template = props.get("chat_template") if isinstance(props, dict) else None
    return template if isinstance(template, str) else None


def get_text(session: requests.Session, url: str, timeout_s: float = 2.0) -> str | None:
    """GET ``url`` as text; ``None`` on any failure or non-200 status."""
    try:
        response = session.get(url, timeout=timeout_s)
        if response.status_code != 200:
            return None
        return response.text
    except requests.RequestException:
        return None


def busy_from_slots(payload: Any) -> int | None:
    """Number of slots ``/slots`` reports as processing; ``None`` when the shape is unknown."""
    if not isinstance(payload, list):
        return None
    return sum(1 for slot in payload if isinstance(slot, dict) and slot.get("is_processing"))


def tasks_from_slots(payload: Any) -> tuple[int, ...]:
    """Task ids of the slots ``/slots`` reports as processing."""
    if not isinstance(payload, list):
        return ()
    out: list[int] = []
    for slot in payload:
        if isinstance(slot, dict) and slot.get("is_processing"):
            task = as_int(slot.get("id_task"))
            if task is not None:
                out.append(task)
    return tuple(out)


def busy_from_metrics(text: str, name: str = "llamacpp:requests_processing") -> int | None:
    """The value of a Prometheus gauge in ``/metrics`` text (its series summed); ``None``
    when absent."""
    total = metric_total(parse_prometheus(text), name)
    return None if total is None else int(total)
