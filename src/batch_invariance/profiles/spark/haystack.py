"""The bundled, hermetic haystack corpus of the spark profile.

The corpus is three template files (prose, news-like items, code) and a lexicon, all shipped
as package data next to this module and read through :mod:`importlib.resources` (never from
the current folder, never from the network). :func:`haystack_blocks` expands them into an
endless, deterministic stream of blocks: every block is a template picked by a seeded RNG with
its ``{slots}`` filled from the lexicon, so the stream is varied rather than one paragraph
repeated, and any prefix of it depends only on the seed.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

_SLOT = re.compile(r"\{([A-Za-z]+)(\d?)\}")

#: Numeric slots and how they are drawn.
_NUMBERS: Mapping[str, tuple[int, int]] = {
    "num": (3, 480),
    "pct": (2, 38),
    "year": (1979, 2016),
}


@dataclass(frozen=True)
class Corpus:
    """The parsed corpus: template lists per kind and the lexicon."""

    prose: tuple[str, ...]
    news: tuple[str, ...]
    code: tuple[str, ...]
    lexicon: Mapping[str, tuple[str, ...]]


_PACKAGE = __name__.rpartition(".")[0]


def _read(name: str) -> str:
    return resources.files(_PACKAGE).joinpath("corpus").joinpath(name).read_text(encoding="utf-8")


def _paragraphs(text: str) -> tuple[str, ...]:
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    blocks = "\n".join(lines).split("\n\n")
    return tuple(" ".join(b.split()) for b in blocks if b.strip())


def _code_items(text: str) -> tuple[str, ...]:
    parts = text.split("\n----\n")
    # The first part is the header comment.
    return tuple(p.strip("\n") for p in parts[1:] if p.strip())


@lru_cache(maxsize=1)
def load_corpus() -> Corpus:
    """Read the bundled corpus (cached; it is immutable package data)."""
    lexicon_raw = json.loads(_read("lexicon.json"))
    return Corpus(
        prose=_paragraphs(_read("prose.txt")),
        news=_paragraphs(_read("news.txt")),
        code=_code_items(_read("code.txt")),
        lexicon={k: tuple(v) for k, v in lexicon_raw.items()},
    )


def fill_template(template: str, rng: random.Random, lexicon: Mapping[str, tuple[str, ...]]) -> str:
    """Fill ``{slot}`` / ``{slot2}`` / ``{Slot}`` from the lexicon (numbers for numeric slots).

    The same slot name within one template gets the same value; ``{place2}`` gets a value
    different from ``{place}`` where the list allows. Unknown slots raise ``KeyError`` so a
    typo in a template is caught by the tests rather than shipped.
    """
    chosen: dict[str, str] = {}

    def pick(match: re.Match[str]) -> str:
        word, suffix = match.group(1), match.group(2)
        key = word.lower()
        slot = key + suffix
        if slot not in chosen:
            if key in _NUMBERS:
                low, high = _NUMBERS[key]
                chosen[slot] = str(rng.randint(low, high))
            else:
                options = list(lexicon[key])
                taken = {v for s, v in chosen.items() if s.rstrip("0123456789") == key}
                fresh = [o for o in options if o not in taken] or options
                chosen[slot] = rng.choice(fresh)
        value = chosen[slot]
        return value[:1].upper() + value[1:] if word[:1].isupper() else value

    return _SLOT.sub(pick, template)


def haystack_blocks(seed_key: str) -> Iterator[str]:
    """An endless deterministic stream of filled corpus blocks for ``seed_key``.

    Kinds are drawn with weights (prose most often, then news, then code); within a kind the
    templates are dealt from a shuffled bag, so a template comes back only after every other
    template of its kind has been used (and then with fresh slot values).
    """
    corpus = load_corpus()
    rng = random.Random(f"spark-haystack|{seed_key}")
    kinds: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("prose", corpus.prose),
        ("news", corpus.news),
        ("code", corpus.code),
    )
    bags: dict[str, list[str]] = {}
    while True:
        kind, templates = rng.choices(kinds, weights=(5, 3, 2))[0]
        if not bags.get(kind):
            bag = list(templates)
            rng.shuffle(bag)
            bags[kind] = bag
        yield fill_template(bags[kind].pop(), rng, corpus.lexicon)
