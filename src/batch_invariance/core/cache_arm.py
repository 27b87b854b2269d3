"""The prompt-cache arm (pure): cold serial A against the same requests sent the way a deployed
client sends them, with the server's prompt cache on, concurrently at N.

Every other arm sends ``cache_prompt: false`` to a server started with ``--cache-ram 0``, so
each comparison starts cold. The cache arm is the only one that reuses cached prompt tokens;
its passes are compared with A bitwise, like every other arm (scored fields, tokens,
logprobs). What it proves needs two things:

* **reuse, proven by the server**: each answer's ``timings.cache_n`` (llama-server) or
  ``usage.prompt_tokens_details.cached_tokens`` (vLLM, SGLang) says how many prompt tokens
  came from the cache. A request counts as reusing when it reused at least
  :data:`MIN_REUSED_TOKENS` (a shared preamble or an earlier turn, not a lone BOS token), and
  at least :data:`REQUIRED_REUSE_SHARE` of the answered requests must; a request that reports
  nothing counts as not reused. Otherwise the arm
  proves nothing about the cache and the cell is UNVERIFIED for that claim.
* **attribution**: a difference counts as the cache's own only on ids where every C pass
  (same N, cache off) matched A bitwise: there, co-batching alone changed nothing. A
  difference on an id that co-batching already changed is reported as such, never as the
  cache's.

:func:`cache_outcome` gives the cert's ``prompt_cache`` block; the verdict
(:mod:`batch_invariance.core.verdict`) reads its ``status``.

The prompt-cache work-set shape (pure): any work-set turned into the traffic a prompt cache
serves, so that the prompt-cache arm really reuses cached tokens.

Two kinds of reuse, as deployed clients cause them:

* a **shared preamble**: every row starts with the same :data:`PREAMBLE` (a system prompt, or
  its text ahead of a raw completion prompt), so every request after the first can reuse it;
* **multi-turn conversations**: rows are grouped ``turns`` at a time into one conversation
  whose later turns extend the earlier ones (turn k's prompt is turn k-1's, then a fixed
  assistant reply, then row k's own prompt), so a later turn reuses all of an earlier one.

Rows come out turn-major (every conversation's first turn, then every second turn, ...), so a
conversation's earlier turn has been answered before its later one is sent in order. Ids,
expected answers and families are the rows' own; ``meta`` says the conversation and turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Literal

from batch_invariance.core.diff import PairReport, compare
from batch_invariance.core.evidence import ItemMeta, PassRecord, Trial
from batch_invariance.core.numerics import PairNumerics, compare_pair, evidence_gate
from batch_invariance.core.plan import WorkItem, row_id

__all__ = [
    "ASSISTANT_TURN",
    "DEFAULT_TURNS",
    "MIN_REUSED_TOKENS",
    "PAIR_CACHE",
    "PREAMBLE",
    "REQUIRED_REUSE_SHARE",
    "CacheReuse",
    "CacheStatus",
    "PromptCacheOutcome",
    "cache_outcome",
    "cache_shaped",
    "conversation_chains",
    "reuse_of",
]

#: The pair name of A against the cache arm's passes.
PAIR_CACHE = "A_cache"
#: At least this share of the cache arm's answered requests must report reused prompt tokens.
REQUIRED_REUSE_SHARE = Fraction(1, 2)
#: A request reused its cache when the server reports at least this many prompt tokens.
MIN_REUSED_TOKENS = 16

#: ``clean``: bitwise equal to A everywhere. ``drift``: tokens or logprobs differ (no scored
#: field) on ids where every C pass matched A bitwise. ``changed``: a scored field differs on
#: such an id. ``with_co_batching``: it differs only where co-batching alone already did.
#: ``unverified``: too little reuse, transport failures or missing logprobs in the arm.
CacheStatus = Literal["clean", "drift", "changed", "with_co_batching", "unverified"]


@dataclass(frozen=True)
class CacheReuse:
    """What the server said it reused, over the cache arm's answered requests."""

    ok: bool
    n_answered: int
    #: Requests that reported at least :data:`MIN_REUSED_TOKENS` reused prompt tokens.
    n_reused: int
    #: Answered requests whose server reported no reuse count at all.
    n_unreported: int
    #: Prompt tokens reused, summed over requests, and the prompt tokens they sent.
    tokens_reused: int
    prompt_tokens: int
    required_share: float
    min_reused_tokens: int
    reason: str


@dataclass(frozen=True)
class PromptCacheOutcome:
    """The cert's ``prompt_cache`` block: what the cache arm measured and what it says."""

    status: CacheStatus
    n_passes: int
    reuse: CacheReuse
    #: A against the cache arm's passes (the union over them), like AC.
    report: PairReport
    numerics: PairNumerics
    #: Ids with a scored difference, and with token-only or numeric differences, where every
    #: C pass matched A bitwise: the cache's own.
    cache_only_divergent_ids: tuple[str, ...]
    cache_only_drift_ids: tuple[str, ...]
    #: Ids that differ with the cache where co-batching alone already changed something.
    with_co_batching_ids: tuple[str, ...]
    #: Why the arm cannot back a claim (transport failures, missing logprobs); empty if none.
    evidence_problems: tuple[str, ...]
    reason: str


def _cache_n(trial: Trial) -> int | None:
    value = trial.timings.get("cache_n")
    return None if value is None else int(value)


def reuse_of(passes: Sequence[PassRecord]) -> CacheReuse:
    """How much the server reused over ``passes``, and whether that is enough."""
    answered = [t for p in passes for t in p.trials.values() if not t.is_transport_failure]
    counts = [_cache_n(t) for t in answered]
    n_reused = sum(1 for c in counts if c is not None and c >= MIN_REUSED_TOKENS)
    n_unreported = counts.count(None)
    tokens = sum(c for c in counts if c)
    prompt = sum(t.prompt_tokens_measured or 0 for t in answered)
    share = float(REQUIRED_REUSE_SHARE)
    ok = bool(answered) and Fraction(n_reused, len(answered)) >= REQUIRED_REUSE_SHARE
    silent = f", {n_unreported} reported no reuse count" if n_unreported else ""
    said = (
        f"{n_reused} of {len(answered)} cache-arm request(s) reused >= {MIN_REUSED_TOKENS} "
        "cached prompt tokens "
        f"({tokens} of {prompt} prompt tokens, as the server reported){silent}"
    )
    if ok:
        reason = f"prompt-cache reuse proven: {said} (need >= {share:.0%})"
    elif not answered:
        reason = "prompt-cache reuse not proven: the cache arm answered no request"
    else:
        reason = (
            f"prompt-cache reuse not proven: {said}, need >= {share:.0%}; the cache arm says "
            "nothing about the cache (use a work-set with shared preambles or multi-turn "
            "conversations: --cache-shape)"
        )
    return CacheReuse(ok, len(answered), n_reused, n_unreported, tokens, prompt, share,
                      MIN_REUSED_TOKENS, reason)  # fmt: skip


def _evidence_problems(passes: Sequence[PassRecord]) -> tuple[str, ...]:
    problems: list[str] = []
    failed = sum(1 for p in passes for t in p.trials.values() if t.is_transport_failure)
    if failed:
        problems.append(f"{failed} transport failure(s) in the cache arm leave comparisons unmade")
    gate = evidence_gate({f"cache[{p.index}]": p.trials.values() for p in passes})
    if not gate.ok:
        problems.append(gate.reason)
    return tuple(problems)


def _words(ids: Iterable[str]) -> str:
    listed = sorted(ids)
    shown = ", ".join(listed[:5]) + (" ..." if len(listed) > 5 else "")
    return f"{len(listed)} id(s) ({shown})"


def cache_outcome(
    a: Mapping[str, Trial],
    passes: Sequence[PassRecord],
    items: Iterable[ItemMeta],
    c_not_bitwise_equal: Iterable[str],
    eps: float,
) -> PromptCacheOutcome:
    """A against the cache arm. ``c_not_bitwise_equal`` names the ids where some C pass
    differed from A at all (a scored field, tokens, or logprobs beyond ``eps``)."""
    ordered = sorted(passes, key=lambda p: p.index)
    maps = [(p.index, p.trials) for p in ordered]
    report = compare(PAIR_CACHE, a, maps, items)
    numerics = compare_pair(PAIR_CACHE, a, maps)
    reuse = reuse_of(ordered)
    problems = _evidence_problems(ordered)
    co = frozenset(c_not_bitwise_equal)
    divergent = set(report.divergent_ids)
    differ = divergent | set(report.token_divergence_ids) | set(numerics.drift_ids_beyond(eps))
    only_divergent = tuple(sorted(divergent - co))
    only_drift = tuple(sorted(differ - divergent - co))
    entangled = tuple(sorted(differ & co))
    status: CacheStatus
    if only_divergent:
        status = "changed"
        reason = (
            f"prompt cache changed a scored field on {_words(only_divergent)} whose every C "
            "pass (same N, cache off) matched A bitwise: the difference comes with the cache"
        )
    elif not reuse.ok or problems:
        status = "unverified"
        reason = "; ".join(([] if reuse.ok else [reuse.reason]) + list(problems))
    elif only_drift:
        status = "drift"
        reason = (
            f"prompt cache changed tokens or logprobs (no scored field) on "
            f"{_words(only_drift)} whose every C pass matched A bitwise: the numerics move "
            "with the cache"
        )
    elif entangled:
        status = "with_co_batching"
        reason = (
            f"the cache arm differs from A only on {_words(entangled)} where co-batching "
            "alone already changed something: the cache's own effect cannot be told apart"
        )
    else:
        status = "clean"
        reason = (
            f"prompt cache on: tokens and logprobs bitwise equal to A at {numerics.positions} "
            f"positions over {report.n_compared} id(s) x {len(ordered)} pass(es); {reuse.reason}"
        )
    return PromptCacheOutcome(
        status, len(ordered), reuse, report, numerics, only_divergent, only_drift, entangled,
        problems, reason,
    )  # fmt: skip


DEFAULT_TURNS = 3

#: The shared preamble (about 120 tokens on a Gemma tokenizer).
PREAMBLE = (
    "You are a careful writing assistant for a small public library. The library runs a "
    "weekly storytelling evening for children and adults, and its volunteers collect short "
    "openings that visitors start and the assistant continues. Keep the tone warm and plain, "
    "avoid lists, headings and markup, and write in full sentences that a ten-year-old can "
    "read aloud. Stay with the characters and places the opening introduces, do not add a "
    "moral at the end, and never address the reader directly. If an opening is unfinished, "
    "carry on from its last word as if you had written it yourself, keeping its tense and "
    "its point of view."
)
#: What stands for the assistant's earlier answer between two turns (a fixed text, so every
#: arm sends the same bytes).
ASSISTANT_TURN = "Thank you, I have noted that. Please give me the next opening."


def _text(item: WorkItem) -> str:
    """The row's own request as one text: its prompt, or its last user message."""
    if item.prompt is not None:
        return item.prompt
    users = [c for r, c in item.messages or () if r == "user"]
    return users[-1] if users else ""


def _turn(conversation: Sequence[WorkItem], k: int, index: int, chat: bool) -> WorkItem:
    item = conversation[k]
    meta = {**item.meta, "conversation": index, "turn": k + 1}
    if chat:
        messages: list[tuple[str, str]] = [("system", PREAMBLE)]
        for earlier in conversation[:k]:
            messages += [("user", _text(earlier)), ("assistant", ASSISTANT_TURN)]
        messages.append(("user", _text(item)))
        return replace(item, prompt=None, messages=tuple(messages), system=None, meta=meta)
    parts = [PREAMBLE]
    for earlier in conversation[:k]:
        parts += [_text(earlier), ASSISTANT_TURN]
    parts.append(_text(item))
    return replace(item, prompt="\n\n".join(parts), messages=None, system=None, meta=meta)


def cache_shaped(items: Sequence[WorkItem], turns: int = DEFAULT_TURNS) -> tuple[WorkItem, ...]:
    """``items`` as conversations of ``turns`` rows behind the shared preamble, turn-major.
    Rows with ``messages`` become chat conversations; prompt rows stay prompts."""
    if turns < 1:
        raise ValueError(f"turns must be at least 1 (got {turns})")
    conversations = [items[i : i + turns] for i in range(0, len(items), turns)]
    shaped: list[WorkItem] = []
    for k in range(turns):
        for index, conversation in enumerate(conversations):
            if k < len(conversation):
                chat = any(i.messages is not None for i in conversation)
                shaped.append(_turn(conversation, k, index, chat))
    return tuple(shaped)


def conversation_chains(items: Sequence[WorkItem]) -> tuple[tuple[str, ...], ...]:
    """The test ids of ``items`` grouped into the chains one client sends one after another:
    each conversation (per repetition) in turn order; a row outside any conversation is a
    chain of its own. Chains keep the order of their first row.

    Why: a later turn can only reuse its earlier turn once that turn has been answered, and
    only where the slot that answered it is idle. On a sliding-window model (Gemma 3) with
    llama-server's defaults a request that shares only the preamble with a slot's cache
    reuses nothing (no context checkpoint inside the shared part), so a turn sent while its
    earlier turn is still in flight is evaluated cold."""
    chains: dict[object, list[tuple[int, int, str]]] = {}
    for position, item in enumerate(items):
        conversation = item.meta.get("conversation")
        rep = item.test_id[len(row_id(item.test_id)) :]
        key: object = ("row", item.test_id) if conversation is None else (conversation, rep)
        turn = item.meta.get("turn", 0)
        chains.setdefault(key, []).append(
            (turn if isinstance(turn, int) else 0, position, item.test_id)
        )
    return tuple(tuple(test_id for _, _, test_id in sorted(chain)) for chain in chains.values())
