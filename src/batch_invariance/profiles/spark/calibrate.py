"""Fit a prompt to a token target by choosing how much haystack surrounds the needles.

Pure apart from the ``token_counter`` it is given (offline: an approximate counter; live: the
A server's ``/tokenize``). The haystack is a deterministic stream of word pieces; the fitted
prompt is the shortest prefix of it whose token count is closest to the target, with the
needles inserted at paragraph boundaries at their depths.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

#: Counts the tokens of a text (the content only, without chat-template or BOS tokens).
TokenCounter = Callable[[str], int]

#: How far (relative) a fitted prompt may land from its target.
TOLERANCE = 0.03

#: The lines that open and close the document in every prompt.
DOC_START = "--- DOCUMENT ---"
DOC_END = "--- END OF DOCUMENT ---"
#: The last line of every prompt: chat models read it as part of the request, base models
#: (``--endpoint completions``) as the start of their answer.
ANSWER_CUE = "Answer:"

_PIECE = re.compile(r"\w+\s*|[^\w\s]\s*")


@dataclass(frozen=True)
class PromptParts:
    """The fixed parts of a prompt; the haystack goes between ``head`` and ``tail``."""

    intro: str
    needles: tuple[str, ...]
    depths: tuple[float, ...]
    question: str


@dataclass(frozen=True)
class Fitted:
    """A fitted prompt, its measured token count, and the haystack size used."""

    prompt: str
    tokens: int
    haystack_pieces: int


@dataclass(frozen=True)
class NoFit:
    """Why a prompt could not be fitted (the fixed parts alone are too long, or no fit)."""

    reason: str
    min_tokens: int


class _Pieces:
    """A lazily extended list of haystack word pieces with paragraph boundaries."""

    def __init__(self, blocks: Iterator[str]) -> None:
        self._blocks = blocks
        self.pieces: list[str] = []
        #: Piece indices at which a new paragraph starts (0 always counts).
        self.starts: list[int] = [0]

    def ensure(self, n: int) -> None:
        while len(self.pieces) < n:
            block = next(self._blocks)
            if self.pieces:
                self.starts.append(len(self.pieces))
            self.pieces.extend(_PIECE.findall(block.strip() + "\n\n"))


def _boundary(starts: Sequence[int], position: int) -> int:
    best = 0
    for s in starts:
        if s > position:
            break
        best = s
    return best


def assemble(parts: PromptParts, pieces: Sequence[str], starts: Sequence[int]) -> str:
    """The prompt with ``pieces`` as haystack and the needles at their depths."""
    k = len(pieces)
    cuts = [_boundary(starts, round(d * k)) for d in parts.depths]
    chunks: list[str] = []
    previous = 0
    for cut, needle in zip(cuts, parts.needles, strict=False):
        segment = "".join(pieces[previous:cut]).strip()
        if segment:
            chunks.append(segment)
        chunks.append(needle.strip())
        previous = cut
    tail = "".join(pieces[previous:]).strip()
    if tail:
        chunks.append(tail)
    document = "\n\n".join(chunks)
    return f"{parts.intro}\n\n{DOC_START}\n{document}\n{DOC_END}\n\n{parts.question}\n{ANSWER_CUE}"


def fit_prompt(
    parts: PromptParts,
    blocks: Iterator[str],
    target: int,
    counter: TokenCounter,
    *,
    min_tolerance: float = 0.0,
) -> Fitted | NoFit:
    """Choose the haystack length whose prompt lands closest to ``target`` tokens.

    Returns :class:`NoFit` when even the bare prompt (no haystack) exceeds the target by more
    than :data:`TOLERANCE` (or ``min_tolerance`` tokens, if more), or when no length lands
    within it.
    """
    source = _Pieces(blocks)
    memo: dict[int, int] = {}

    def count(k: int) -> int:
        if k not in memo:
            source.ensure(k)
            memo[k] = counter(assemble(parts, source.pieces[:k], source.starts))
        return memo[k]

    tol = max(TOLERANCE * target, min_tolerance)
    bare = count(0)
    if bare > target + tol:
        return NoFit(
            reason=f"the needles and question alone take {bare} tokens (target {target})",
            min_tokens=bare,
        )
    if bare >= target:
        return Fitted(prompt=assemble(parts, [], [0]), tokens=bare, haystack_pieces=0)
    # Secant steps towards the target, then a bracketed binary search for the first length
    # that reaches it; finally the best of its neighbours (counts are not strictly monotone).
    k = max(1, int((target - bare) / 1.3))
    for _ in range(4):
        c = count(k)
        if c == target:
            break
        rate = max((c - bare) / k, 0.05)
        # Never 0: a step that lands on the bare prompt would divide by zero next time.
        k = max(1, round((target - bare) / rate))
    lo, hi, step = k, k, 8
    while lo > 0 and count(lo) >= target:
        lo = max(0, lo - step)
        step *= 2
    step = 8
    while count(hi) < target:
        lo = max(lo, hi)
        hi += step
        step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(mid) >= target:
            hi = mid
        else:
            lo = mid
    candidates = range(max(0, hi - 3), hi + 4)
    best = min(candidates, key=lambda n: (abs(count(n) - target), n))
    tokens = count(best)
    if abs(tokens - target) > tol:
        return NoFit(
            reason=f"closest fit is {tokens} tokens, more than 3% from target {target}",
            min_tokens=bare,
        )
    return Fitted(
        prompt=assemble(parts, source.pieces[:best], source.starts),
        tokens=tokens,
        haystack_pieces=best,
    )
