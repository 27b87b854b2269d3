"""The mock's oracle: its tokenizer and the (correct) answers it gives to known prompt shapes.

Questions of a few known shapes (arithmetic, capitals, secret codes, reversing or upper-casing
a word, counting letters) get their right answer, so a scorer has something real to judge;
anything else gets a deterministic filler sentence. Everything here is a pure function of text.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Mapping

#: The tokenizer's pieces: optional leading whitespace plus a word or one symbol, or trailing
#: whitespace. Concatenating the pieces gives back the text exactly.
_PIECE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")

_CAPITALS: Mapping[str, str] = {
    "france": "Paris",
    "japan": "Tokyo",
    "italy": "Rome",
    "germany": "Berlin",
    "spain": "Madrid",
    "canada": "Ottawa",
    "egypt": "Cairo",
    "kenya": "Nairobi",
    "peru": "Lima",
    "norway": "Oslo",
}

_FILLER = (
    "the", "model", "reads", "a", "long", "prompt", "and", "writes", "short", "notes",
    "about", "batches", "slots", "tokens", "servers", "quietly", "today",
)  # fmt: skip


def tokenize(text: str) -> list[str]:
    """Split ``text`` into the mock's token pieces (deterministic, lossless)."""
    return _PIECE.findall(text)


def token_id(piece: str) -> int:
    """A stable id for a piece (the mock has no vocabulary file)."""
    return 10 + zlib.crc32(piece.encode()) % 50000


def answer_for(prompt: str) -> str:
    """The mock's (correct) answer to a prompt: a pure function of the text."""
    text = prompt
    m = re.search(r"what is (-?\d+)\s*([-+*x×])\s*(-?\d+)", text, re.IGNORECASE)
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return str(value)
    m = re.search(r"secret code is ([A-Za-z0-9-]+)", text, re.IGNORECASE)
    if m and re.search(r"what is the secret code", text, re.IGNORECASE):
        return m.group(1)
    m = re.search(r"capital of ([A-Za-z]+)", text, re.IGNORECASE)
    if m and m.group(1).lower() in _CAPITALS:
        return _CAPITALS[m.group(1).lower()]
    m = re.search(r"reverse the word ([A-Za-z]+)", text, re.IGNORECASE)
    if m:
        return m.group(1)[::-1]
    m = re.search(r"spell ([A-Za-z]+) in (?:upper ?case|capitals)", text, re.IGNORECASE)
    if m:
        return m.group(1).upper()
    m = re.search(r"how many letters (?:are )?in (?:the word )?([A-Za-z]+)", text, re.IGNORECASE)
    if m:
        return str(len(m.group(1)))
    return note_for(text)


#: Open questions get a note of this many words or more (a few more by hash): long enough for
#: the answer-length floor of a GREEN (64 tokens), so a late divergence has room to show.
NOTE_MIN_WORDS = 66
NOTE_EXTRA_WORDS = 24


def note_for(text: str) -> str:
    """A deterministic note of filler words for an open prompt, one token per word and no
    final punctuation (so a first-line scorer and exact match read the same answer). Chat
    markup is ignored: the same question gets the same note through either endpoint."""
    question = re.sub(r"<start_of_turn>\w*\n|<end_of_turn>\n?", "", text).strip()
    stream = hashlib.sha256(question.encode()).digest()
    while len(stream) < 1 + NOTE_MIN_WORDS + NOTE_EXTRA_WORDS:
        stream += hashlib.sha256(stream).digest()
    n_words = NOTE_MIN_WORDS + stream[0] % NOTE_EXTRA_WORDS
    words = [_FILLER[b % len(_FILLER)] for b in stream[1 : 1 + n_words]]
    return " ".join(words).capitalize()


def diverged_answer(answer: str) -> str:
    """A score-bearing change of ``answer``: what batching noise would do to a right answer."""
    if re.fullmatch(r"-?\d+", answer):
        return str(int(answer) + 1)
    if not answer:
        return "?"
    last = answer[-1]
    if last.isalpha():
        base = "a" if last.islower() else "A"
        return answer[:-1] + chr(ord(base) + (ord(last) - ord(base) + 1) % 26)
    return answer + "!"


def resplit(pieces: list[str]) -> list[str]:
    """The same text in a different segmentation: the first long piece split in two."""
    for i, piece in enumerate(pieces):
        core = piece.lstrip()
        if len(core) >= 2:
            cut = len(piece) - len(core) + len(core) // 2
            return [*pieces[:i], piece[:cut], piece[cut:], *pieces[i + 1 :]]
    return list(pieces)
