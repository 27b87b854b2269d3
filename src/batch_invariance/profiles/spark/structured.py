"""The spark families whose answer has a structure: a typed JSON record (E2), a JSON tool call
(E3), a fixed function (E4) and the one helper in a call graph (E5).

Like every family, each is a pure function ``(rng) -> Task``; needle vocabularies are
disjoint from the haystack lexicon.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from batch_invariance.profiles.spark.task import Task, canonical_json, draw_depths, draw_fn_name

_CARRIERS = ("Nordwind Freight", "Baltica Cargo", "Kestrel Haulage", "Solway Lines")
_PORTS = ("Varnholt", "Quessant", "Ostrava Quay", "Liddow", "Brackmoor", "Tyrnavos")
_ATTENDEES = ("Ysolde Marsh", "Bertil Okafor", "Cosima Ruiz", "Anselm Kader", "Wren Tashiro")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
_SOURCES = ("manifest", "payload", "roster", "bundle", "ledger", "catalog")
_SOURCE_VERBS = ("fetch", "read", "pull", "open")


# --------------------------------------------------------------------------- E2
_E2_FIELDS: tuple[tuple[str, str], ...] = (
    ("carrier", "string"),
    ("destination", "string"),
    ("crates", "integer"),
    ("weight_kg", "number"),
    ("fragile", "boolean"),
)


def family_e2(rng: random.Random) -> Task:
    """E2: return only a JSON object with typed fields taken from one record."""
    ref = f"SR-{rng.randint(1000, 9999)}"
    record = {
        "carrier": rng.choice(_CARRIERS),
        "destination": rng.choice(_PORTS),
        "crates": rng.randint(2, 60),
        "weight_kg": rng.randint(200, 4000) / 2,
        "fragile": rng.random() < 0.5,
    }
    fragile = "marked fragile" if record["fragile"] else "not fragile"
    spec = ", ".join(f'"{n}" ({t})' for n, t in _E2_FIELDS)
    return Task(
        needles=(
            f"Shipment record {ref}: carried by {record['carrier']} to "
            f"{record['destination']}; {record['crates']} crates with a total weight of "
            f"{record['weight_kg']} kg; {fragile}.",
        ),
        depths=draw_depths(rng, 1),
        question=(
            f"Return only a JSON object describing shipment {ref} with exactly these fields: "
            f"{spec}. No prose and no code fence."
        ),
        expected=canonical_json(record),
        meta={"fields": [list(f) for f in _E2_FIELDS]},
    )


# --------------------------------------------------------------------------- E3
_TOOLS: tuple[Mapping[str, Any], ...] = (
    {
        "name": "schedule_meeting",
        "parameters": {"attendee": "string", "day": "string", "hour": "integer"},
    },
    {"name": "cancel_meeting", "parameters": {"meeting_id": "integer"}},
    {"name": "send_reminder", "parameters": {"attendee": "string", "minutes_before": "integer"}},
)


def family_e3(rng: random.Random) -> Task:
    """E3: return only a JSON tool call (name + arguments) matching a given schema."""
    ticket = rng.randint(1000, 9999)
    kind = rng.randrange(len(_TOOLS))
    attendee = rng.choice(_ATTENDEES)
    arguments: dict[str, Any]
    if kind == 0:
        arguments = {"attendee": attendee, "day": rng.choice(_DAYS), "hour": rng.randint(8, 17)}
        text = (
            f"please book a meeting with {attendee} on {arguments['day']} at "
            f"{arguments['hour']}:00."
        )
    elif kind == 1:
        arguments = {"meeting_id": rng.randint(100, 999)}
        text = f"meeting number {arguments['meeting_id']} is no longer needed; please cancel it."
    else:
        arguments = {"attendee": attendee, "minutes_before": rng.choice((5, 10, 15, 30, 45))}
        text = (
            f"send {attendee} a reminder {arguments['minutes_before']} minutes before "
            "the meeting starts."
        )
    tool = _TOOLS[kind]
    return Task(
        needles=(f"Help-desk ticket {ticket}: {text}",),
        depths=draw_depths(rng, 1),
        question=(
            f"Handle help-desk ticket {ticket} from the document with exactly one of these "
            f"tools: {canonical_json(list(_TOOLS))}. Return only a JSON object of the form "
            '{"name": TOOL_NAME, "arguments": {...}} whose arguments match that tool\'s '
            "parameters and types. No prose."
        ),
        expected=canonical_json({"name": tool["name"], "arguments": arguments}),
        meta={"tools": [dict(t) for t in _TOOLS]},
    )


# --------------------------------------------------------------------------- E4
#: (correct body, buggy body, what the function should do); ``{name}`` is the function name.
_E4_CASES: tuple[tuple[str, str, str], ...] = (
    (
        "def {name}(n):\n    total = 0\n    for i in range(1, n + 1):\n"
        "        total += i\n    return total\n",
        "def {name}(n):\n    total = 0\n    for i in range(1, n):\n"
        "        total += i\n    return total\n",
        "should return the sum of the integers from 1 to n inclusive",
    ),
    (
        "def {name}(values):\n    best = values[0]\n    for v in values[1:]:\n"
        "        if v > best:\n            best = v\n    return best\n",
        "def {name}(values):\n    best = values[0]\n    for v in values[1:]:\n"
        "        if v < best:\n            best = v\n    return best\n",
        "should return the largest element of a non-empty list",
    ),
    (
        "def {name}(items, target):\n    count = 0\n    for item in items:\n"
        "        if item == target:\n            count += 1\n    return count\n",
        "def {name}(items, target):\n    count = 1\n    for item in items:\n"
        "        if item == target:\n            count += 1\n    return count\n",
        "should return how many elements of items are equal to target",
    ),
    (
        "def {name}(values):\n    result = 1\n    for v in values:\n"
        "        result *= v\n    return result\n",
        "def {name}(values):\n    result = 1\n    for v in values:\n"
        "        result += v\n    return result\n",
        "should return the product of the values",
    ),
    (
        "def {name}(values):\n    if not values:\n        return 0.0\n"
        "    return sum(values) / len(values)\n",
        "def {name}(values):\n    if values:\n        return 0.0\n"
        "    return sum(values) / len(values)\n",
        "should return the mean of the values, or 0.0 for an empty list",
    ),
)


def family_e4(rng: random.Random) -> Task:
    """E4: fix the one bug in a small function and return only the function."""
    name = draw_fn_name(rng, set())
    correct, buggy, purpose = rng.choice(_E4_CASES)
    return Task(
        needles=(f"Code under review:\n\n{buggy.format(name=name)}",),
        depths=draw_depths(rng, 1),
        question=(
            f"The function {name} in the document has exactly one bug: it {purpose}. Fix the "
            "bug and return only the corrected function in a ```python fenced code block, "
            "with no explanation."
        ),
        expected=correct.format(name=name),
        meta={"function": name},
    )


# --------------------------------------------------------------------------- E5
def family_e5(rng: random.Random) -> Task:
    """E5: name the one helper that both calls a given function and returns a dict."""
    source = rng.choice(_SOURCES)
    verbs = rng.sample(_SOURCE_VERBS, 2)
    target = f"{verbs[0]}_{source}"
    lookalike = f"{verbs[1]}_{source}"
    taken: set[str] = {target, lookalike}
    names = [draw_fn_name(rng, taken) for _ in range(4)]
    right, calls_list, lookalike_dict, plain_dict = names
    helpers = [
        f"def {right}(path):\n    data = {target}(path)\n"
        '    return {"path": path, "size": len(data)}\n',
        f"def {calls_list}(path):\n    data = {target}(path)\n"
        "    return [line for line in data if line]\n",
        f"def {lookalike_dict}(path):\n    data = {lookalike}(path)\n"
        '    return {"path": path, "size": len(data)}\n',
        f'def {plain_dict}(path):\n    return {{"path": path, "cached": False}}\n',
    ]
    rng.shuffle(helpers)
    candidates = sorted(names)
    return Task(
        needles=("Helpers from the storage module:\n\n" + "\n\n".join(helpers),),
        depths=draw_depths(rng, 1),
        question=(
            f"Which helper function in the storage module both calls {target} and returns a "
            "dict? Reply with the function name only."
        ),
        expected=right,
        meta={"target": target, "candidates": candidates},
    )
