"""An independent check of ``batch-invariance compare``: plain HTTP, no project code.

Sends the same completion bodies, one at a time, to two running OpenAI-compatible servers
(two builds of llama-server, or llama-server and llama-cpp-python on one GGUF) and counts, per
prompt, whether the two answers are identical (text, tokens and every logprob), drifted
(same tokens, some logprob differs) or changed (another token). It starts nothing: start
each server with ``--parallel 1`` yourself (docs/compare.md has the commands).

    python benchmarks/probe_compare.py --workset W.json --n-predict 48 \\
        --old http://127.0.0.1:PORT1 --new http://127.0.0.1:PORT2

The bodies follow what a cert records in ``provenance.request_template`` for the completions
endpoint (temperature 0, top_k 1, the per-id seed rule, no prompt cache, ``logprobs: 2``),
written out again here on purpose rather than imported.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Any

import requests


def seed(run_seed: int, test_id: str) -> int:
    digest = hashlib.sha256(f"{run_seed}:{test_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def ask(base: str, row: dict[str, Any], n_predict: int) -> tuple[str, list[str], list[float]]:
    body = {
        "prompt": row["prompt"],
        "temperature": 0,
        "top_k": 1,
        "seed": seed(0, row["id"]),
        "cache_prompt": False,
        "max_tokens": n_predict,
        "stream": False,
        "logprobs": 2,
    }
    r = requests.post(base.rstrip("/") + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    lp = choice.get("logprobs") or {}
    if "content" in lp:  # llama-server's native layout
        tokens = [t["token"] for t in lp["content"]]
        values = [float(t["logprob"]) for t in lp["content"]]
    else:  # the OpenAI completions layout (llama-cpp-python)
        tokens = list(lp.get("tokens") or [])
        values = [float(v) for v in lp.get("token_logprobs") or []]
    return str(choice["text"]), tokens, values


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workset", required=True)
    p.add_argument("--n-predict", type=int, default=48)
    p.add_argument("--old", required=True)
    p.add_argument("--new", required=True)
    p.add_argument("--json", action="store_true", help="print one JSON line per prompt too")
    args = p.parse_args()
    with open(args.workset, encoding="utf-8") as f:
        rows = json.load(f)
    counts = {"identical": 0, "drift": 0, "changed": 0}
    for row in rows:
        t_old, tok_old, lp_old = ask(args.old, row, args.n_predict)
        t_new, tok_new, lp_new = ask(args.new, row, args.n_predict)
        if t_old != t_new or tok_old != tok_new:
            kind = "changed"
        elif lp_old != lp_new:
            kind = "drift"
        else:
            kind = "identical"
        counts[kind] += 1
        if args.json:
            print(json.dumps({"id": row["id"], "class": kind}))
    print(
        f"probe: {len(rows)} prompts: {counts['identical']} identical, {counts['drift']} drift "
        f"(same tokens, logprobs differ), {counts['changed']} changed (another token)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
