"""The ten spark task families: each draws a needle (or several), a question and the answer.

A family is a pure function ``(rng) -> Task``. Everything it returns is decided by the RNG
alone, never by the tokenizer or the model, so every model is measured on the same tasks;
only the amount of haystack around the needles is fitted to each tokenizer later.

Needle vocabularies are disjoint from the haystack lexicon so that a needle's answer occurs in
a prompt exactly once.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Letters used in codes (no I or O, which read like digits).
_CODE_LETTERS = "".join(c for c in string.ascii_uppercase if c not in "IO")

_RELAYS = ("Vesper", "Kestrel", "Halcyon", "Morrow", "Quillon", "Sable", "Tamsin", "Corvid")
_KEYS = ("Cobalt", "Juniper", "Saffron", "Quartz", "Mistral", "Tundra", "Obsidian", "Zephyr")
_REGISTERS = ("glim", "tarn", "vosk", "plim", "drex", "mulk", "quon", "fesk")
_TEAMS = ("crimson", "teal", "ochre", "violet", "silver", "indigo")
_MASCOTS = ("otter", "lynx", "badger", "ibex", "marmot", "puffin", "gecko", "walrus")
_CARRIERS = ("Nordwind Freight", "Baltica Cargo", "Kestrel Haulage", "Solway Lines")
_PORTS = ("Varnholt", "Quessant", "Ostrava Quay", "Liddow", "Brackmoor", "Tyrnavos")
_ATTENDEES = ("Ysolde Marsh", "Bertil Okafor", "Cosima Ruiz", "Anselm Kader", "Wren Tashiro")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
_FN_VERBS = ("tally", "fold", "weigh", "stamp", "crank", "sift", "braid", "spool")
_FN_NOUNS = ("quorum", "pellet", "beacon", "spindle", "cinder", "trellis", "gasket", "lintel")
_SOURCES = ("manifest", "payload", "roster", "bundle", "ledger", "catalog")
_SOURCE_VERBS = ("fetch", "read", "pull", "open")


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


def _code(rng: random.Random) -> str:
    letters = "".join(rng.choice(_CODE_LETTERS) for _ in range(4))
    digits = "".join(rng.choice(string.digits) for _ in range(4))
    return f"{letters[:2]}-{digits}-{letters[2:]}"


def _depths(rng: random.Random, n: int) -> tuple[float, ...]:
    return tuple(sorted(round(rng.uniform(0.08, 0.92), 3) for _ in range(n)))


def _fn_name(rng: random.Random, taken: set[str]) -> str:
    while True:
        name = f"{rng.choice(_FN_VERBS)}_{rng.choice(_FN_NOUNS)}"
        if name not in taken:
            taken.add(name)
            return name


def canonical_json(value: Any) -> str:
    """The canonical JSON text used for expected answers of the JSON families."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --------------------------------------------------------------------------- A2
def family_a2(rng: random.Random) -> Task:
    """A2: look up one secret activation code."""
    relay = rng.choice(_RELAYS)
    code = _code(rng)
    return Task(
        needles=(
            f"Security notice: the secret activation code for the {relay} relay is {code}. "
            "Do not share it outside the operations team.",
        ),
        depths=_depths(rng, 1),
        question=(
            f"What is the secret activation code for the {relay} relay? "
            "Reply with the code only (format XX-0000-XX)."
        ),
        expected=code,
        meta={"relay": relay},
    )


# --------------------------------------------------------------------------- A4
_OPS: Mapping[str, tuple[str, Callable[[int, int], int]]] = {
    "add": ("add {v}", lambda x, v: x + v),
    "sub": ("subtract {v}", lambda x, v: x - v),
    "mul": ("multiply the result by {v}", lambda x, v: x * v),
}


def family_a4(rng: random.Random) -> Task:
    """A4: a four-step arithmetic chain."""
    start = rng.randint(4, 40)
    kinds = ["add", "sub", "mul", rng.choice(("add", "sub"))]
    rng.shuffle(kinds)
    value = start
    steps: list[str] = []
    for kind in kinds:
        operand = rng.randint(2, 5) if kind == "mul" else rng.randint(2, 25)
        template, apply = _OPS[kind]
        steps.append(template.format(v=operand))
        value = apply(value, operand)
    ordinals = ("One", "Two", "Three", "Four")
    text = " ".join(f"Step {o}: {s}." for o, s in zip(ordinals, steps, strict=False))
    return Task(
        needles=(f"Ledger procedure: begin with the number {start}. {text}",),
        depths=_depths(rng, 1),
        question=(
            "Apply the four steps of the ledger procedure in the document, in order, starting "
            "from its beginning number. What is the final result? Reply with the number only."
        ),
        expected=str(value),
        meta={"start": start, "steps": steps},
    )


# --------------------------------------------------------------------------- B1
_FORMS: tuple[tuple[str, Callable[[int, int, int], int]], ...] = (
    ("{a} * {b} + {c}", lambda a, b, c: a * b + c),
    ("{a} + {b} * {c}", lambda a, b, c: a + b * c),
    ("({a} + {b}) * {c}", lambda a, b, c: (a + b) * c),
    ("{a} * {b} - {c}", lambda a, b, c: a * b - c),
)


def family_b1(rng: random.Random) -> Task:
    """B1: three variables, each stated in its own needle, combined in one expression."""
    names = rng.sample(_REGISTERS, 3)
    values = [rng.randint(2, 15) for _ in names]
    form, fn = rng.choice(_FORMS)
    expression = form.format(a=names[0], b=names[1], c=names[2])
    needles = tuple(
        f"Calibration note: the register {n} holds the value {v}."
        for n, v in zip(names, values, strict=False)
    )
    order = list(range(3))
    rng.shuffle(order)
    return Task(
        needles=tuple(needles[i] for i in order),
        depths=_depths(rng, 3),
        question=(
            f"Using the register values from the calibration notes in the document, compute "
            f"{expression}. Reply with the number only."
        ),
        expected=str(fn(*values)),
        meta={"registers": dict(zip(names, values, strict=False)), "expression": expression},
    )


# --------------------------------------------------------------------------- C1
_C1_TEMPLATES: tuple[str, ...] = (
    "def {name}(n):\n"
    "    total = {a}\n"
    "    for i in range({k}):\n"
    "        total += i * {b}\n"
    "    return total - n\n",
    "def {name}(x):\n"
    "    if x % {m} == 0:\n"
    "        return x // {m} + {a}\n"
    "    return x * {b} - {a}\n",
    "def {name}(n):\n"
    "    result = {a}\n"
    "    while n > {stop}:\n"
    "        result += n % {m}\n"
    "        n -= {step}\n"
    "    return result\n",
)


def _run_generated(source: str, name: str, arg: int) -> int:
    """Evaluate a function this module generated itself (never user text)."""
    namespace: dict[str, Any] = {}
    exec(compile(source, "<spark-c1>", "exec"), {"__builtins__": {"range": range}}, namespace)
    result = namespace[name](arg)
    assert isinstance(result, int)
    return result


def family_c1(rng: random.Random) -> Task:
    """C1: the return value of a small generated Python function."""
    name = _fn_name(rng, set())
    template = rng.choice(_C1_TEMPLATES)
    source = template.format(
        name=name,
        a=rng.randint(1, 20),
        b=rng.randint(2, 6),
        k=rng.randint(3, 6),
        m=rng.randint(2, 5),
        stop=rng.randint(0, 3),
        step=rng.randint(2, 4),
    )
    arg = rng.randint(5, 24)
    return Task(
        needles=(f"Utility from the scheduling module:\n\n{source}",),
        depths=_depths(rng, 1),
        question=f"What does {name}({arg}) return? Reply with the integer only.",
        expected=str(_run_generated(source, name, arg)),
        meta={"function": name, "argument": arg},
    )


# --------------------------------------------------------------------------- D1
def family_d1(rng: random.Random) -> Task:
    """D1: three facts, each in its own needle, to be listed."""
    teams = rng.sample(_TEAMS, 3)
    mascots = rng.sample(_MASCOTS, 3)
    needles = tuple(
        f"Club bulletin: the {t} team's mascot is a {m}."
        for t, m in zip(teams, mascots, strict=False)
    )
    order = list(range(3))
    rng.shuffle(order)
    return Task(
        needles=tuple(needles[i] for i in order),
        depths=_depths(rng, 3),
        question=(
            f"According to the club bulletins in the document, what are the mascots of the "
            f"{teams[0]}, {teams[1]} and {teams[2]} teams? List the three animals in that "
            "order, one per line, and nothing else."
        ),
        expected="; ".join(mascots),
        meta={"teams": teams, "facts": mascots},
    )


# --------------------------------------------------------------------------- E1
def family_e1(rng: random.Random) -> Task:
    """E1: codes for four keys, asked for in an order different from the document's."""
    keys = rng.sample(_KEYS, 4)
    codes: list[str] = []
    while len(codes) < 4:
        code = str(rng.randint(100000, 999999))
        if code not in codes:
            codes.append(code)
    asked = list(range(4))
    while asked == [0, 1, 2, 3]:
        rng.shuffle(asked)
    asked_keys = [keys[i] for i in asked]
    return Task(
        needles=tuple(
            f"Vault register: the access code for key {k} is {c}."
            for k, c in zip(keys, codes, strict=False)
        ),
        depths=_depths(rng, 4),
        question=(
            f"List the access codes for keys {', '.join(asked_keys[:3])} and {asked_keys[3]}, "
            "in exactly that order, one code per line. Reply with the four codes only."
        ),
        expected=",".join(codes[i] for i in asked),
        meta={"keys": asked_keys},
    )


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
        depths=_depths(rng, 1),
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
        depths=_depths(rng, 1),
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
    name = _fn_name(rng, set())
    correct, buggy, purpose = rng.choice(_E4_CASES)
    return Task(
        needles=(f"Code under review:\n\n{buggy.format(name=name)}",),
        depths=_depths(rng, 1),
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
    names = [_fn_name(rng, taken) for _ in range(4)]
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
        depths=_depths(rng, 1),
        question=(
            f"Which helper function in the storage module both calls {target} and returns a "
            "dict? Reply with the function name only."
        ),
        expected=right,
        meta={"target": target, "candidates": candidates},
    )


#: Family id -> builder, in work-set order.
FAMILIES: Mapping[str, Callable[[random.Random], Task]] = {
    "A2": family_a2,
    "A4": family_a4,
    "B1": family_b1,
    "C1": family_c1,
    "D1": family_d1,
    "E1": family_e1,
    "E2": family_e2,
    "E3": family_e3,
    "E4": family_e4,
    "E5": family_e5,
}
