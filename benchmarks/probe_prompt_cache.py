"""Independent probe of llama-server's prompt cache: the same prompts warm against cold.

No batch-invariance code: plain HTTP with ``requests`` against one llama-server this script
starts itself (``--parallel N``, its default ``--cache-ram`` unless ``--server-flag`` says
otherwise). For every prompt it sends

* **cold**: ``cache_prompt: false`` (the whole prompt evaluated), one request at a time;
* **warm**: the same body without ``cache_prompt`` (the server's default: reuse what its slot
  or its host-memory cache holds), after every prompt was sent cold, N clients at a time:
  a lone prompt is sent twice back to back and the second answer is the warm one; with
  ``--turns K`` each client sends one conversation's turns in order (turn k+1 only once turn
  k was answered), and every turn is a warm answer.

Why not "every prompt once, in order": on a sliding-window model (Gemma 3) llama-server with
its defaults reuses a slot's cache only up to a context checkpoint, made at the end of each
prompt; a prompt that shares only the preamble with the slot's last prompt ("forcing full
prompt re-processing due to lack of cache data") reuses nothing.

and counts the rows whose generated tokens, or whose pre-sampling logprobs at any position
up to the first token difference, differ bitwise, and the prompt tokens the server says it
reused (``timings.cache_n``) on the warm requests.

Prompts: a shared preamble (about 120 tokens) ahead of each of the ``--prompts`` openings,
as the issue's probe did; ``--turns K`` instead chains them into conversations of K turns.

Usage: python benchmarks/probe_prompt_cache.py --server-bin S --model M [--prompts 12]
       [--n-predict 48] [--parallel 1] [--server-flag=-ub --server-flag=1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

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
OPENINGS = [
    "The old lighthouse keeper climbed the spiral stairs for the last time, and",
    "The little robot had never held a paintbrush before. It dipped the brush and",
    "Once every hundred years a night market appears at the edge of the village. The first stall",
    "There was once a dragon who was afraid of the dark. Every evening",
    "The train left the station exactly at midnight, and nobody on board",
    "My grandmother kept a box of letters under her bed. One rainy afternoon",
    "The astronaut looked out of the window and saw, far below,",
    "In the middle of the forest stood a door with no house around it.",
    "The baker woke at four every morning, but today the oven",
    "When the snow finally melted, the children found a map",
    "The cat sat on the windowsill and watched the postman, who",
    "At the bottom of the well there was a small light that",
    "The clockmaker's apprentice opened the drawer he was told never to open.",
    "On the island, the only telephone rang once a year.",
    "The river changed its course overnight, and the village",
    "Nobody in town remembered planting the giant sunflower, yet",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prompts(n: int, turns: int) -> list[str]:
    openings = OPENINGS[:n]
    if turns <= 1:
        return [f"{PREAMBLE}\n\n{o}" for o in openings]
    out = []
    for start in range(0, len(openings), turns):
        text = PREAMBLE
        for o in openings[start : start + turns]:
            text = f"{text}\n\n{o}"
            out.append(text)
            text = f"{text}\n\nThank you, I have noted that. Please give me the next opening."
    return out


def body(prompt: str, n_predict: int, cold: bool) -> dict[str, Any]:
    b: dict[str, Any] = {
        "prompt": prompt, "max_tokens": n_predict, "temperature": 0, "top_k": 1, "seed": 7,
        "logprobs": 2, "stream": False,
    }  # fmt: skip
    if cold:
        b["cache_prompt"] = False
    return b


def chains(texts: list[str], turns: int) -> list[list[str]]:
    """One client's requests, sent one after another: a conversation's turns in order, or
    (``turns`` 1) a prompt on its own."""
    return [texts[i : i + max(turns, 1)] for i in range(0, len(texts), max(turns, 1))]


def warm_chain(url: str, chain: list[str], n_predict: int, turns: int) -> list[tuple[str, Any]]:
    """The warm answers of one chain. A lone prompt is sent twice back to back and the second
    answer is the warm one (a repeat served from the cache); a conversation's turns are sent
    in order, each after the one before was answered, and each turn is the warm answer (it
    reuses the earlier turn its prompt extends)."""
    out = []
    for text in chain:
        if turns <= 1:
            post(url, body(text, n_predict, False))  # primes the slot with this very prompt
        out.append((text, post(url, body(text, n_predict, False))))
    return out


def post(url: str, b: dict[str, Any]) -> dict[str, Any]:
    r = requests.post(url + "/v1/completions", json=b, timeout=600)
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


def stream(data: dict[str, Any]) -> tuple[list[str], list[float], list[float]]:
    content = data["choices"][0]["logprobs"]["content"]
    tokens = [c["token"] for c in content]
    chosen = [c["logprob"] for c in content]
    second = [c["top_logprobs"][1]["logprob"] if len(c["top_logprobs"]) > 1 else 0.0
              for c in content]  # fmt: skip
    return tokens, chosen, second


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server-bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--turns", type=int, default=1)
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--server-flag", action="append", default=[])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    port = free_port()
    argv = [args.server_bin, "--model", args.model, "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(args.parallel), "--ctx-size", str(args.ctx * args.parallel),
            "--no-webui", *args.server_flag]  # fmt: skip
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)  # noqa: SIM115 (kept for the reader)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                sys.exit(f"server exited {proc.returncode}; log {log.name}")
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                sys.exit("server not ready")
            time.sleep(0.5)
        texts = prompts(args.prompts, args.turns)
        t0 = time.monotonic()
        cold = [post(url, body(p, args.n_predict, True)) for p in texts]
        with ThreadPoolExecutor(args.parallel) as pool:  # N chains at a time
            sent = pool.map(lambda chain: warm_chain(url, chain, args.n_predict, args.turns),
                            chains(texts, args.turns))  # fmt: skip
            by_text = {t: r for chain in sent for t, r in chain}
        warm = [by_text[t] for t in texts]
        wall = time.monotonic() - t0
        rows = []
        for k, (c, w) in enumerate(zip(cold, warm, strict=True)):
            ct, cl, c2 = stream(c)
            wt, wl, w2 = stream(w)
            flip = next((i for i, (x, y) in enumerate(zip(ct, wt, strict=False)) if x != y),
                        None if ct == wt else min(len(ct), len(wt)))  # fmt: skip
            n = len(ct) if flip is None else flip
            drift = next((i for i in range(n) if cl[i] != wl[i] or c2[i] != w2[i]), None)
            rows.append({
                "row": k, "cold_cache_n": c.get("timings", {}).get("cache_n"),
                "warm_cache_n": w.get("timings", {}).get("cache_n"),
                "prompt_tokens": w.get("usage", {}).get("prompt_tokens"),
                "token_flip": flip, "first_logprob_drift": drift,
            })  # fmt: skip
        summary = {
            "server_flags": args.server_flag, "parallel": args.parallel,
            "prompts": len(texts), "turns": args.turns, "n_predict": args.n_predict,
            "rows_tokens_differ": sum(r["token_flip"] is not None for r in rows),
            "rows_logprobs_differ": sum(r["first_logprob_drift"] is not None for r in rows),
            "rows_any_difference": sum(
                r["token_flip"] is not None or r["first_logprob_drift"] is not None for r in rows
            ),
            "warm_rows_reused": sum(bool(r["warm_cache_n"]) for r in rows),
            "warm_tokens_reused": sum(r["warm_cache_n"] or 0 for r in rows),
            "cold_tokens_reused": sum(r["cold_cache_n"] or 0 for r in rows),
            "wall_s": round(wall, 1),
            "rows": rows,
        }  # fmt: skip
        print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(summary, fh, indent=1)
        return 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
