"""The ten spark task families: each draws a needle (or several), a question and the answer.

A family is a pure function ``(rng) -> Task``. Everything it returns is decided by the RNG
alone, never by the tokenizer or the model, so every model is measured on the same tasks;
only the amount of haystack around the needles is fitted to each tokenizer later.

Needle vocabularies are disjoint from the haystack lexicon so that a needle's answer occurs in
a prompt exactly once.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from batch_invariance.profiles.spark.structured import family_e2, family_e3, family_e4, family_e5
from batch_invariance.profiles.spark.task import (
    Task,
    draw_code,
    draw_depths,
    draw_fn_name,
    scattered_task,
)

_RELAYS = ("Vesper", "Kestrel", "Halcyon", "Morrow", "Quillon", "Sable", "Tamsin", "Corvid")
_KEYS = ("Cobalt", "Juniper", "Saffron", "Quartz", "Mistral", "Tundra", "Obsidian", "Zephyr")
_REGISTERS = ("glim", "tarn", "vosk", "plim", "drex", "mulk", "quon", "fesk")
_TEAMS = ("crimson", "teal", "ochre", "violet", "silver", "indigo")
_MASCOTS = ("otter", "lynx", "badger", "ibex", "marmot", "puffin", "gecko", "walrus")


# --------------------------------------------------------------------------- A2
def family_a2(rng: random.Random) -> Task:
    """A2: look up one secret activation code."""
    relay = rng.choice(_RELAYS)
    code = draw_code(rng)
    return Task(
        needles=(
            f"Security notice: the secret activation code for the {relay} relay is {code}. "
            "Do not share it outside the operations team.",
        ),
        depths=draw_depths(rng, 1),
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
        depths=draw_depths(rng, 1),
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
    return scattered_task(
        rng,
        needles,
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
    name = draw_fn_name(rng, set())
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
        depths=draw_depths(rng, 1),
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
    return scattered_task(
        rng,
        needles,
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
        depths=draw_depths(rng, 4),
        question=(
            f"List the access codes for keys {', '.join(asked_keys[:3])} and {asked_keys[3]}, "
            "in exactly that order, one code per line. Reply with the four codes only."
        ),
        expected=",".join(codes[i] for i in asked),
        meta={"keys": asked_keys},
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
