"""llama-server's read-only endpoints: its busy witnesses and the chat template it applies.

``/slots`` and ``/metrics`` say how many requests the server is processing at once (the
co-batching witness the dispatcher samples); ``/props`` names the chat template.
"""

from __future__ import annotations

from typing import Any

import requests

from batch_invariance.engines.probes import BusyProbe, as_int, get_json
from batch_invariance.engines.prometheus import metric_total, parse_prometheus

__all__ = [
    "busy_from_metrics",
    "busy_from_slots",
    "llama_server_probes",
    "server_chat_template",
    "tasks_from_slots",
]


def server_chat_template(base_url: str) -> str | None:
    """The chat template the server applies (``/props`` ``chat_template``); ``None`` unknown."""
    with requests.Session() as session:
        props = get_json(session, base_url.rstrip("/") + "/props")
    template = props.get("chat_template") if isinstance(props, dict) else None
    return template if isinstance(template, str) else None


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


def llama_server_probes(
    base_url: str, metrics_enabled: bool, metrics_url: str | None = None
) -> tuple[BusyProbe, ...]:
    """llama-server's witnesses: ``/slots`` always, ``/metrics`` when the server serves it."""
    base = base_url.rstrip("/")
    probes = [BusyProbe("slots", base + "/slots", "json", busy_from_slots, tasks_from_slots)]
    if metrics_enabled:
        url = metrics_url or base + "/metrics"
        probes.append(BusyProbe("metrics", url, "text", busy_from_metrics))
    return tuple(probes)
