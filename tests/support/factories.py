"""Small builders of evidence, verdicts and certs for tests (reusable by anyone).

``green_evidence()`` gives evidence that decides GREEN under the default policy: every id is
scored ``ok`` and identical in every arm, each C pass has all intervals overlapping by far
more than the margin and the server reported busy slots. Tests then change one thing with
:func:`replace_trial`, :func:`replace_pass` or :func:`dataclasses.replace`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from batch_invariance.cert.advice import engine_advice
from batch_invariance.cert.certificate import Cert, build_cert
from batch_invariance.cert.parse import parse_cert
from batch_invariance.cert.provenance import Provenance
from batch_invariance.core.evidence import (
    CellEvidence,
    CellSpec,
    GatePolicy,
    ItemMeta,
    PassRecord,
    Trial,
)
from batch_invariance.core.verdict import Verdict, decide

TS = "2025-01-02T03:04:05Z"
#: Server-reported generated tokens of a factory trial: above the default length floor.
ANSWER_TOKENS = 80
DEFAULT_POLICY = GatePolicy()


def load_cert(path: Path) -> Cert:
    """The cert at ``path``, parsed (schema and digest) as the verification path reads it."""
    return parse_cert(path.read_text(encoding="utf-8"), str(path))


def answer_for(test_id: str) -> str:
    return f"answer-{test_id}"


def make_trial(
    test_id: str,
    *,
    completion: str | None = None,
    score: float | None = 1.0,
    passed: bool | None = True,
    extracted_answer: str | None = None,
    expected_answer: str | None = None,
    prompt_tokens_measured: int | None = 12,
    failure_mode: str = "ok",
    tokens: tuple[str, ...] | None = None,
    token_logprobs: tuple[float, ...] | None = None,
    top_margins: tuple[float | None, ...] | None = None,
    interval: tuple[float, float] | None = None,
    slot_id: int | None = None,
    completion_tokens: int | None = ANSWER_TOKENS,
    finish_reason: str | None = "stop",
    cache_n: float | None = 0.0,
    numerics: bool = True,
) -> Trial:
    """A genuinely scored, passing trial unless told otherwise: an answer of
    :data:`ANSWER_TOKENS` server-reported tokens that stopped by itself, with ``cache_n`` 0.
    With ``numerics`` (the default) it carries tokens (the text's characters unless given)
    with a logprob and a top1-top2 margin at each, a pure function of the tokens."""
    text = answer_for(test_id) if completion is None else completion
    if numerics and failure_mode == "ok":
        tokens = tuple(text) if tokens is None else tokens
        if token_logprobs is None:
            token_logprobs = tuple(-0.0130917 * (i % 7) - 0.00713 for i in range(len(tokens)))
        if top_margins is None:
            top_margins = tuple(0.37 + 0.011 * (i % 5) for i in range(len(tokens)))
    return Trial(
        test_id=test_id,
        score=score,
        passed=passed,
        extracted_answer=text.strip() if extracted_answer is None else extracted_answer,
        expected_answer=answer_for(test_id) if expected_answer is None else expected_answer,
        prompt_tokens_measured=prompt_tokens_measured,
        failure_mode=failure_mode,
        completion=text,
        content_sha256=hashlib.sha256(text.encode()).hexdigest(),
        completion_tokens=completion_tokens,
        finish_reason=finish_reason,
        tokens=tokens,
        token_logprobs=token_logprobs,
        top_margins=top_margins,
        dispatch_ts=None if interval is None else interval[0],
        complete_ts=None if interval is None else interval[1],
        slot_id=slot_id,
        timings={} if cache_n is None else {"cache_n": cache_n},
    )


def transport_failure(
    test_id: str, mode: str = "timeout", interval: tuple[float, float] | None = None
) -> Trial:
    """A request that produced nothing to judge."""
    return Trial(
        test_id=test_id,
        score=None,
        passed=None,
        extracted_answer=None,
        expected_answer=answer_for(test_id),
        prompt_tokens_measured=None,
        failure_mode=mode,
        dispatch_ts=None if interval is None else interval[0],
        complete_ts=None if interval is None else interval[1],
        transport_error=f"{mode} (test)",
    )


def ids(n: int) -> list[str]:
    return [f"t{i:03d}" for i in range(n)]


#: Prompt tokens of a factory trial by id (ids not named: 12).
PromptTokens = Mapping[str, int]


def ladder_prompts(test_ids: list[str], slot_ctx: int) -> dict[str, int]:
    """Prompt lengths that climb with the ids until prompt + answer is 9/10 of the slot, as
    the length ladder's do (no shorter than 12 tokens)."""
    n = len(test_ids)
    return {
        t: max(12, round((k + 1) / n * 0.9 * slot_ctx) - ANSWER_TOKENS)
        for k, t in enumerate(test_ids)
    }


def serial_map(test_ids: list[str], prompts: PromptTokens | None = None) -> dict[str, Trial]:
    """A serial arm: intervals one after another (never overlapping)."""
    lengths = prompts or {}
    return {
        t: make_trial(
            t, interval=(float(k), float(k) + 0.5), prompt_tokens_measured=lengths.get(t, 12)
        )
        for k, t in enumerate(test_ids)
    }


def concurrent_pass(
    test_ids: list[str],
    index: int,
    busy: int | None = 4,
    spread: float = 0.001,
    prompts: PromptTokens | None = None,
) -> PassRecord:
    """A C pass whose intervals all overlap one another by about a second."""
    lengths = prompts or {}
    trials = {
        t: make_trial(
            t,
            interval=(100.0 * (index + 1) + k * spread, 100.0 * (index + 1) + 1.0 + k * spread),
            slot_id=k % 4,
            prompt_tokens_measured=lengths.get(t, 12),
        )
        for k, t in enumerate(test_ids)
    }
    return PassRecord(
        index=index,
        trials=trials,
        server_busy_max=busy,
        busy_source="slots" if busy is not None else "none",
        order=tuple(test_ids),
    )


def green_evidence(
    n_ids: int = 32, n_passes: int = 2, serial_repeat: bool = True, slot_ctx: int | None = None
) -> CellEvidence:
    """Evidence that decides GREEN under :data:`DEFAULT_POLICY` (>= 30 distinct prompts).

    ``slot_ctx`` records the slot (the sequence-scope rule then applies) and gives the
    prompts lengths that climb to fill 9/10 of it; without it the slot is not recorded, as
    in a cert written before the rule, and every prompt is 12 tokens."""
    test_ids = ids(n_ids)
    prompts = None if slot_ctx is None else ladder_prompts(test_ids, slot_ctx)
    return CellEvidence(
        items=tuple(
            ItemMeta(t, family="fam" + str(k % 2), fill=0.5) for k, t in enumerate(test_ids)
        ),
        a=serial_map(test_ids, prompts),
        a_repeat=serial_map(test_ids, prompts) if serial_repeat else None,
        b=serial_map(test_ids, prompts),
        c_passes=tuple(concurrent_pass(test_ids, i, prompts=prompts) for i in range(n_passes)),
        slot_ctx=slot_ctx,
    )


def replace_trial(
    evidence: CellEvidence, arm: str, test_id: str, trial: Trial | None, pass_index: int = 0
) -> CellEvidence:
    """A copy of ``evidence`` with one trial replaced (``None`` removes it).

    ``arm`` is "A", "A_repeat", "B" or "C" (then ``pass_index`` picks the pass).
    """

    def swap(m: Mapping[str, Trial]) -> dict[str, Trial]:
        out = dict(m)
        if trial is None:
            out.pop(test_id, None)
        else:
            out[test_id] = trial
        return out

    if arm == "A":
        return replace(evidence, a=swap(evidence.a))
    if arm == "A_repeat":
        assert evidence.a_repeat is not None
        return replace(evidence, a_repeat=swap(evidence.a_repeat))
    if arm == "B":
        return replace(evidence, b=swap(evidence.b))
    if arm == "C":
        passes = tuple(
            replace(p, trials=swap(p.trials)) if p.index == pass_index else p
            for p in evidence.c_passes
        )
        return replace(evidence, c_passes=passes)
    raise ValueError(arm)


def changed(trial: Trial, **changes: Any) -> Trial:
    """``trial`` with some fields changed (content sha follows a changed completion)."""
    if "completion" in changes and "content_sha256" not in changes:
        text = changes["completion"]
        changes["content_sha256"] = (
            None if text is None else hashlib.sha256(text.encode()).hexdigest()
        )
    return replace(trial, **changes)


def replace_pass(evidence: CellEvidence, index: int, **changes: Any) -> CellEvidence:
    passes = tuple(replace(p, **changes) if p.index == index else p for p in evidence.c_passes)
    return replace(evidence, c_passes=passes)


def spec(
    model: str = "tiny-model", ctx: int = 2048, n: int = 4, is_moe: bool | None = False
) -> CellSpec:
    kv = f"split:-c {ctx * n} -np {n} (ctx {ctx} per slot, no-kv-unified)"
    return CellSpec(model=model, ctx=ctx, dispatch_n=n, kv_label=kv, reps=1, is_moe=is_moe)


PROVENANCE: dict[str, Any] = {"tool": "batch-invariance", "scorer": "exact_match"}
MODEL_SHA = "ab" * 32


def server_argv(model_path: str, ctx: int, parallel: int) -> list[str]:
    """The argv the live launcher records for one server (split KV, ctx per slot)."""
    return [
        "/opt/llama/bin/llama-server", "--model", model_path, "--host", "127.0.0.1",
        "--port", "40000", "--parallel", str(parallel), "--ctx-size", str(ctx * parallel),
        "--no-kv-unified", "--slots", "--cache-ram", "0", "--no-webui", "--metrics",
    ]  # fmt: skip


def live_provenance(cell: CellSpec) -> dict[str, Any]:
    """A provenance that agrees with ``cell``: the model file and the A / BC servers started
    on it, as run-live records them."""
    path = f"/models/{cell.model}.gguf"
    return {
        **PROVENANCE,
        "driver": "run-live",
        "model_file": {"path": path, "name": f"{cell.model}.gguf", "sha256": MODEL_SHA},
        "servers": [
            {"role": "A", "argv": server_argv(path, cell.ctx, 1)},
            {"role": "BC", "argv": server_argv(path, cell.ctx, cell.dispatch_n)},
        ],
        # Per-arm timings as the driver records them (the throughput block is read from here).
        "arms": [
            {
                "arm": "A",
                "pass": None,
                "wall_s": 20.0,
                "n_requests": 20,
                "server_predicted_ms": 16000.0,
                "server_predicted_n": 1280,
            },
            {
                "arm": "B",
                "pass": None,
                "wall_s": 20.5,
                "n_requests": 20,
                "server_predicted_ms": 16400.0,
                "server_predicted_n": 1280,
            },
            {
                "arm": "C",
                "pass": 0,
                "wall_s": 8.0,
                "n_requests": 20,
                "server_predicted_ms": 25600.0,
                "server_predicted_n": 1280,
            },
            {
                "arm": "C",
                "pass": 1,
                "wall_s": 8.0,
                "n_requests": 20,
                "server_predicted_ms": 25600.0,
                "server_predicted_n": 1280,
            },
        ],
    }


def cert_for(
    evidence: CellEvidence | None = None,
    policy: GatePolicy = DEFAULT_POLICY,
    source: str = "live",
    cell: CellSpec | None = None,
    extra_provenance: Mapping[str, Any] | None = None,
) -> tuple[Cert, Verdict]:
    """Decide and build a cert in one go (``extra_provenance`` merged over the usual block)."""
    ev = green_evidence() if evidence is None else evidence
    cell = cell or spec()
    live = source == "live"
    provenance = live_provenance(cell) if live else {**PROVENANCE, "driver": "run-mock"}
    provenance = {**provenance, **(extra_provenance or {})}
    verdict = decide(ev, policy, engine_advice(Provenance.from_record(provenance).engine_name))
    cert = build_cert(ev, verdict, cell, policy, provenance, "live" if live else "mock", TS)
    return cert, verdict


#: What makes two certs comparable (docs/compare.md): the work-set, the request template and
#: the scorer, as run-live records them.
WORKSET_SHA = "cd" * 32
REQUEST_TEMPLATE: dict[str, Any] = {
    "endpoint": "completions",
    "temperature": 0,
    "top_k": 1,
    "run_seed": 0,
    "seed_rule": "sha256(f'{run_seed}:{test_id}')[:4] & 0x7fffffff",
    "cache_prompt": False,
    "max_tokens": 96,
    "stream": False,
    "logprobs": {"logprobs": 2},
    "logprobs_by_arm": {"A": "margins", "A_repeat": "margins", "B": "margins", "C": "margins"},
    "pre_sampling": True,
    "timeout_s": 120.0,
}


def keyed(evidence: CellEvidence) -> CellEvidence:
    """``evidence`` whose items carry request keys (one distinct request per id)."""
    items = tuple(
        replace(m, request_key="sha256:" + hashlib.sha256(m.test_id.encode()).hexdigest())
        for m in evidence.items
    )
    return replace(evidence, items=items)


def comparable_cert(
    evidence: CellEvidence | None = None,
    *,
    binary_sha: str = "11" * 32,
    engine: str = "llama-server",
    cell: CellSpec | None = None,
    ts_utc: str = TS,
    **provenance: Any,
) -> Cert:
    """A live cert as run-live writes it for ``compare``: model file, work-set, request
    template, scorer and server build recorded (``provenance`` overrides any of them)."""
    ev = keyed(green_evidence() if evidence is None else evidence)
    extra = {
        "workset": {"sha256": WORKSET_SHA, "n_items": len(ev.items)},
        "request_template": REQUEST_TEMPLATE,
        "scorer_id": "exact_match",
        "engine": engine,
        "server_binary": {"path": "/opt/llama/bin/llama-server", "sha256": binary_sha},
        **provenance,
    }
    cell = cell or spec()
    provenance_block = {**live_provenance(cell), **extra}
    advice = engine_advice(Provenance.from_record(provenance_block).engine_name)
    return build_cert(ev, decide(ev, DEFAULT_POLICY, advice), cell, DEFAULT_POLICY,
                      provenance_block, "live", ts_utc)  # fmt: skip


def changed_answer(trial: Trial) -> Trial:
    """``trial`` answering something else: another text, tokens and logprobs, so every scored
    field that reads the answer changes (what a build that changed this answer records)."""
    return changed(
        trial,
        completion="something else",
        extracted_answer="something else",
        tokens=("something", " else"),
        token_logprobs=(-0.5, -0.25),
        top_margins=(0.125, 0.0625),
    )
