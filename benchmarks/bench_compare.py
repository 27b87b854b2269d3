"""Time ``batch-invariance compare`` on two certs of 1,000 prompts x 64 tokens each.

Run: ``python benchmarks/bench_compare.py [--prompts N] [--tokens L]``. Builds two certs as
run-live writes them (every prompt with tokens, pre-sampling logprobs and margins at every
token; the new one with a tenth of the prompts drifted, a twentieth with changed tokens and a
fiftieth with a changed scored field), writes them to a temporary folder and prints the
best of three timings (of five for the processes) of:

* the comparison itself (``core.compare.compare_cells`` on two sides already read),
* reading both sides out of the parsed certs (``cert.compare_view.side_from_cert``),
* verifying one cert through the one verification path (``verify``: schema, duplicate
  keys, digest, structure, the verdict re-derived from A, B and every C pass, identity),
* the whole command path (``compare_inputs``: read and verify both certs, then pair and
  compare), cold (every check on both certs) and warm (both texts already verified under this
  code, recalled from the memo of verified certs, :mod:`batch_invariance.cert.memo`),
* ``batch-invariance compare`` as a process, cold and warm: the above plus Python's start-up
  and the imports.

Verification re-derives each cert from all of its evidence, so it dominates the cold path;
the comparison proper reads arm A only.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from batch_invariance.cert.build import build_cert
from batch_invariance.cert.compare_view import side_from_cert
from batch_invariance.cert.memo import MEMO_ENV
from batch_invariance.cert.parse import parse_cert
from batch_invariance.cert.store import render
from batch_invariance.cert.verify import verify
from batch_invariance.core.compare import compare_cells
from batch_invariance.core.evidence import (
    CellEvidence,
    CellSpec,
    GatePolicy,
    ItemMeta,
    PassRecord,
    Trial,
)
from batch_invariance.core.verdict import decide
from batch_invariance.report.compare_load import compare_inputs

MODEL_SHA = "ab" * 32


def _trial(test_id: str, k: int, tokens: int, drift: float, tail: str, answer: str) -> Trial:
    toks = (*(f"tok{(k * 7 + i) % 311}" for i in range(tokens - 1)), tail)
    text = "".join(toks)
    return Trial(
        test_id=test_id,
        score=1.0,
        passed=True,
        extracted_answer=answer,
        expected_answer=answer,
        prompt_tokens_measured=20,
        failure_mode="ok",
        completion=text,
        content_sha256=hashlib.sha256(text.encode()).hexdigest(),
        completion_tokens=tokens,
        finish_reason="length",
        tokens=toks,
        token_logprobs=tuple(-0.0130917 * (i % 7) - 0.00713 - drift for i in range(tokens)),
        top_margins=tuple(0.37 + 0.011 * (i % 5) for i in range(tokens)),
        dispatch_ts=float(k),
        complete_ts=float(k) + 0.5,
        timings={"cache_n": 0.0},
    )


def _in_pass(trial: Trial, index: int, k: int) -> Trial:
    start = 100.0 * (index + 1) + k * 1e-3
    return replace(trial, dispatch_ts=start, complete_ts=start + 1.0, slot_id=k % 4)


def _arm(n: int, tokens: int, changed: bool) -> dict[str, Trial]:
    out = {}
    for k in range(n):
        tid = f"p{k:05d}"
        drift = 1e-6 if changed and k % 10 == 0 else 0.0
        tail = "TAIL" if changed and k % 20 == 1 else "tail"
        answer = "new" if changed and k % 50 == 3 else "ans"
        out[tid] = _trial(tid, k, tokens, drift, tail, answer)
    return out


def _cert_text(n: int, tokens: int, changed: bool, binary: str) -> str:
    a = _arm(n, tokens, changed)
    items = tuple(
        ItemMeta(t, "fam", None, "sha256:" + hashlib.sha256(t.encode()).hexdigest()) for t in a
    )
    passes = tuple(
        PassRecord(
            index=i,
            trials={t: _in_pass(tr, i, k) for k, (t, tr) in enumerate(a.items())},
            server_busy_max=4,
            busy_source="slots",
            order=tuple(a),
        )
        for i in range(2)
    )
    ev = CellEvidence(items=items, a=a, a_repeat=None, b=a, c_passes=passes)
    cell = CellSpec("m", 1024, 4, "split:-c 4096 -np 4 (ctx 1024 per slot, no-kv-unified)", 1)
    path = "/models/m.gguf"
    argv: Callable[[int], list[str]] = lambda np: [  # noqa: E731
        "/bin/llama-server", "--model", path, "--parallel", str(np),
        "--ctx-size", str(1024 * np), "--no-kv-unified",
    ]  # fmt: skip
    provenance: dict[str, Any] = {
        "driver": "run-live",
        "engine": "llama-server",
        "model_file": {"path": path, "name": "m.gguf", "sha256": MODEL_SHA},
        "servers": [{"role": "A", "argv": argv(1)}, {"role": "BC", "argv": argv(4)}],
        "server_binary": {"sha256": binary},
        "workset": {"sha256": "cd" * 32},
        "request_template": {"endpoint": "completions", "temperature": 0, "max_tokens": tokens},
        "scorer_id": "exact_match",
    }
    policy = GatePolicy()
    cert = build_cert(ev, decide(ev, policy), cell, policy, provenance, "live", "2026-12-03Z")
    return render(cert)


def _best(fn: Callable[[], object], runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    old_text = _cert_text(args.prompts, args.tokens, False, "11" * 32)
    new_text = _cert_text(args.prompts, args.tokens, True, "22" * 32)
    old_cert, new_cert = parse_cert(old_text), parse_cert(new_text)
    old_side, new_side = side_from_cert(old_cert, "old"), side_from_cert(new_cert, "new")
    result = compare_cells(old_side, new_side)
    k = result.counts
    print(
        f"{args.prompts} prompts x {args.tokens} tokens: {k.identical} identical, {k.drift} "
        f"drift, {k.tokens} tokens changed, {k.scored} scored changed (worst {result.worst})"
    )
    t_compare = _best(lambda: compare_cells(old_side, new_side))
    t_sides = _best(lambda: (side_from_cert(old_cert, "o"), side_from_cert(new_cert, "n")))
    with tempfile.TemporaryDirectory() as tmp:
        old_path, new_path = Path(tmp, "old.json"), Path(tmp, "new.json")
        old_path.write_text(old_text)
        new_path.write_text(new_text)
        # As an installed package runs: with its bytecode cached (a first, untimed run writes it).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cold, warm = {**env, MEMO_ENV: "off"}, {**env, MEMO_ENV: f"{tmp}/memo"}
        t_verify = _best(lambda: verify(old_path))
        os.environ[MEMO_ENV] = "off"
        t_cold = _best(lambda: compare_inputs(old_path, new_path, None))
        os.environ[MEMO_ENV] = warm[MEMO_ENV]
        compare_inputs(old_path, new_path, None)  # verifies both in full and remembers them
        t_warm = _best(lambda: compare_inputs(old_path, new_path, None))
        command = ["batch-invariance", "compare", str(old_path), str(new_path), "--allow-unsigned"]
        exe = [sys.executable, "-m", "batch_invariance", *command[1:]]
        subprocess.run(exe, env=warm, capture_output=True, check=False)
        p_cold = _best(lambda: subprocess.run(exe, env=cold, capture_output=True, check=False), 5)
        p_warm = _best(lambda: subprocess.run(exe, env=warm, capture_output=True, check=False), 5)
    size = f"{len(old_text.encode()) / 1e6:.0f} MB"
    print(f"comparison (core.compare.compare_cells):         {t_compare * 1000:8.1f} ms")
    print(f"reading both sides from parsed certs:            {t_sides * 1000:8.1f} ms")
    print(f"verifying one {size} cert in full (verify):       {t_verify * 1000:8.1f} ms")
    print(f"whole command path, cold (verify x2 in full):    {t_cold * 1000:8.1f} ms")
    print(f"whole command path, warm (both recalled):        {t_warm * 1000:8.1f} ms")
    print(f"`{' '.join(command[:2])}` as a process, cold:   {p_cold * 1000:8.1f} ms")
    print(f"`{' '.join(command[:2])}` as a process, warm:   {p_warm * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
