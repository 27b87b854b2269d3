"""Token counters that profiles fit their prompts with.

:func:`approx_token_count` is a deterministic offline estimate (used by ``make-workset``
without a server and by unit tests). :func:`server_token_counter` is the thin shell around a
running llama-server's ``/tokenize``: the count of the real tokenizer, which is what the live
driver calibrates with (once, on the A server) before freezing the work-set.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import requests

from batch_invariance.errors import InfraError

__all__ = ["TokenCounter", "approx_token_count", "server_token_counter"]

#: Counts the tokens of a text (the content only, no chat template or BOS).
TokenCounter = Callable[[str], int]

_APPROX = re.compile(r"[A-Za-z]+|\d|\n+|[^\sA-Za-z\d]")


def approx_token_count(text: str) -> int:
    """A BPE-like estimate: a word is one token per started 6 letters, a digit or a
    punctuation mark is one token, a run of newlines is one token, spaces are free."""
    total = 0
    for piece in _APPROX.findall(text):
        if piece[0].isalpha():
            total += (len(piece) + 5) // 6
        else:
            total += 1
    return total


def server_token_counter(base_url: str, timeout: float = 60.0) -> TokenCounter:
    """A counter backed by ``POST {base_url}/tokenize`` (``add_special`` off).

    Results are memoised per text. A failed request raises :class:`InfraError` with one line.
    """
    url = base_url.rstrip("/") + "/tokenize"
    session = requests.Session()
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        if text in cache:
            return cache[text]
        try:
            response = session.post(
                url, json={"content": text, "add_special": False}, timeout=timeout
            )
            response.raise_for_status()
            tokens = response.json()["tokens"]
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            raise InfraError(
                f"tokenizing a calibration prompt at {url} failed: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(tokens, list):
            raise InfraError(f"{url} returned no token list; is it a llama-server?")
        cache[text] = len(tokens)
        return len(tokens)

    return count
