"""An independent check of the sequence-scope numbers: plain HTTP, no project code.

Starts two llama-servers itself (its own process groups, stopped on exit): a serial one
(``--parallel 1 -c C``) and the cell's (``--parallel N -c C*N``, split KV), both with the
extra flags given (``-ub 1`` ...). Sends every work-set prompt to the serial server one at a
time, then to the parallel server N at a time (one wave after another, all N released
together), and prints per prompt: its prompt tokens (the server's count), the sequence
length compared, whether the answer changed, and the sequence position where drift began:
the length of the sequence the model had read when it gave the first differing logprob
(prompt tokens + index of that generated token).

    python benchmarks/probe_scope.py --server-bin S --model M --workset W.json \\
        --ctx 1024 --parallel 4 --n-predict 96 -- -ub 1

The work-set is any file of rows ``{id, prompt}`` (``make-workset --ladder`` writes the
length ladder the tool itself would measure). The request body is written out here on
purpose rather than imported: raw completions, temperature 0, top_k 1, no prompt cache,
``logprobs: 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, argv: list[str], log: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [*argv, "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited early; see {log}")
            try:
                if requests.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise SystemExit(f"server not ready in 300 s; see {log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def ask(base: str, prompt: str, n_predict: int) -> dict[str, Any]:
    body = {
        "prompt": prompt,
        "temperature": 0,
        "top_k": 1,
        "seed": 1,
        "cache_prompt": False,
        "max_tokens": n_predict,
        "stream": False,
        "logprobs": 1,
    }
    r = requests.post(base + "/v1/completions", json=body, timeout=1200)
    r.raise_for_status()
    data = r.json()
    content = (data["choices"][0].get("logprobs") or {}).get("content") or []
    return {
        "text": data["choices"][0]["text"],
        "tokens": [t["token"] for t in content],
        "logprobs": [float(t["logprob"]) for t in content],
        "prompt_tokens": int(data["usage"]["prompt_tokens"]),
    }


def concurrently(base: str, prompts: list[str], n_predict: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{} for _ in prompts]
    gate = threading.Barrier(len(prompts))

    def work(k: int) -> None:
        gate.wait()
        out[k] = ask(base, prompts[k], n_predict)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--server-bin", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--workset", required=True)
    p.add_argument("--ctx", type=int, required=True, help="tokens per slot")
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--n-predict", type=int, default=96)
    p.add_argument("--log-dir", default="/tmp")
    p.add_argument("flags", nargs="*", help="after --: extra llama-server flags")
    args = p.parse_args()
    with open(args.workset, encoding="utf-8") as handle:
        rows = json.load(handle)
    prompts = [str(r["prompt"]) for r in rows]
    base_argv = [args.server_bin, "-m", args.model, "--no-webui", "--cache-ram", "0", *args.flags]
    n = args.parallel
    t0 = time.monotonic()
    serial = Server([*base_argv, "-np", "1", "-c", str(args.ctx)], f"{args.log_dir}/probe_a.log")
    try:
        a = [ask(serial.base, q, args.n_predict) for q in prompts]
    finally:
        serial.stop()
    t_a = time.monotonic() - t0
    par = Server(
        [*base_argv, "-np", str(n), "-c", str(args.ctx * n), "--no-kv-unified"],
        f"{args.log_dir}/probe_c.log",
    )
    try:
        c: list[dict[str, Any]] = []
        for start in range(0, len(prompts), n):
            c += concurrently(par.base, prompts[start : start + n], args.n_predict)
    finally:
        par.stop()
    t_c = time.monotonic() - t0 - t_a
    print(f"{'id':<22} {'prompt':>6} {'seq':>5} {'changed':>7} {'drift at':>8}")
    drifted = changed = 0
    for row, x, y in zip(rows, a, c, strict=True):
        same = min(len(x["tokens"]), len(y["tokens"]))
        flip = next((i for i in range(same) if x["tokens"][i] != y["tokens"][i]), None)
        upto = flip if flip is not None else same
        first = next((i for i in range(upto) if x["logprobs"][i] != y["logprobs"][i]), None)
        at = None if first is None else x["prompt_tokens"] + first
        moved = x["text"] != y["text"]
        drifted += at is not None
        changed += moved
        seq = x["prompt_tokens"] + min(len(x["tokens"]), len(y["tokens"]))
        print(
            f"{str(row.get('id'))[:22]:<22} {x['prompt_tokens']:>6} {seq:>5} "
            f"{'yes' if moved else 'no':>7} {'-' if at is None else at:>8}"
        )
    print(
        f"rows {len(rows)}: drift in {drifted}, answer changed in {changed}; serial arm "
        f"{t_a:.0f} s, concurrent pass {t_c:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
