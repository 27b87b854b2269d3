"""What asking for token logprobs costs the server, per request.

Starts one real ``llama-server --parallel 1`` (the provisioned embedded pair unless
``--server-bin``/``--model`` are given) and sends the demo's completion openings serially,
each one once per setting, the settings interleaved per prompt so a change of host load hits
all of them alike: no logprobs, top-2 before sampling (what every arm sends: the chosen
token's logprob and the top1-top2 margin, the numeric evidence) and top-``--n-probs``.
Every setting sends ``top_k: 1``. Prints the median seconds per request, the server's own
decode time per token, and whether every setting produced the same text (asking for
logprobs must not change what is generated at temperature 0).

Usage: python benchmarks/bench_logprobs.py [--items K] [--n-predict T] [--n-probs P]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from embedded_pair import add_pair_arguments, pair_from

from batch_invariance.core.roles import ServerRole
from batch_invariance.engines.llama_server.engine import LlamaServerEngine
from batch_invariance.host.gguf import parse_info
from batch_invariance.run.transport import MARGIN_TOP_LOGPROBS, RequestTemplate, run_serial
from batch_invariance.run.workset import bundled_workset_path, load_workset
from batch_invariance.servers import ports
from batch_invariance.servers.launch import EngineLauncher


@dataclass
class Setting:
    name: str
    template: RequestTemplate
    wall_s: list[float] = field(default_factory=list)
    ms_per_token: list[float] = field(default_factory=list)
    #: Server CPU seconds per request: less sensitive than wall time to a host shared with
    #: other work (the wall time then measures the neighbours as much as the request).
    cpu_s: list[float] = field(default_factory=list)
    texts: dict[str, str | None] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def settings(n_predict: int, n_probs: int) -> list[Setting]:
    base = RequestTemplate("completions", n_predict=n_predict, seed=0)
    return [
        Setting("none", base.with_logprobs("none")),
        Setting(f"top-{MARGIN_TOP_LOGPROBS} (every arm)", base),
        Setting(f"top-{n_probs} (--n-probs)", RequestTemplate(
            "completions", n_predict=n_predict, seed=0, n_probs=n_probs
        )),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pair_arguments(ap)
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--n-probs", type=int, default=20)
    ap.add_argument("--ctx", type=int, default=1024)
    opts = ap.parse_args(argv)
    server_bin, model = pair_from(opts)
    items = load_workset(bundled_workset_path("demo_completions")).items[: opts.items]
    runs = settings(opts.n_predict, opts.n_probs)
    launcher = EngineLauncher(
        LlamaServerEngine(),
        server_bin,
        model,
        Path(tempfile.mkdtemp(prefix="bench-logprobs-")),
        port_policy=ports.make_policy(None, []),
        gguf=parse_info(model),
    )
    with launcher.launch(ServerRole.A, 1, opts.ctx) as server:
        proc = psutil.Process(server.process.pid)
        for k, item in enumerate(items):
            for s in runs[k % len(runs) :] + runs[: k % len(runs)]:  # rotate who goes first
                before = proc.cpu_times()
                resp = run_serial(server.base_url, s.template, [item]).responses[item.test_id]
                after = proc.cpu_times()
                s.cpu_s.append(after.user + after.system - before.user - before.system)
                if resp.dispatch_ts is not None and resp.complete_ts is not None:
                    s.wall_s.append(resp.complete_ts - resp.dispatch_ts)
                timings = resp.timings or {}
                if timings.get("predicted_n"):
                    s.ms_per_token.append(timings["predicted_ms"] / timings["predicted_n"])
                s.texts[item.test_id] = resp.text
                s.tokens.append(resp.completion_tokens or 0)
                s.finish.append(resp.finish_reason or resp.failure_mode or "?")
    print(f"server: {server_bin}\nmodel: {model.name}; {len(items)} prompts x {opts.n_predict} "
          "tokens, serial, --parallel 1, settings interleaved per prompt")  # fmt: skip
    print(f"{'logprobs':<20} {'median s/req':>12} {'min s/req':>10} {'decode ms/tok':>14} "
          f"{'server cpu s/req':>17}")  # fmt: skip
    for s in runs:
        print(f"{s.name:<20} {_median(s.wall_s):12.3f} {min(s.wall_s, default=math.nan):10.3f} "
              f"{_median(s.ms_per_token):14.2f} {_median(s.cpu_s):17.3f}")  # fmt: skip
    for s in runs[1:]:
        wall = _median(s.wall_s) / _median(runs[0].wall_s)
        cpu = _median(s.cpu_s) / _median(runs[0].cpu_s)
        print(f"{s.name}: {wall:.3f}x the wall time, {cpu:.3f}x the server CPU of no logprobs")
    first = runs[0]
    stops = sorted(set(first.finish))
    print(f"answer tokens min/max {min(first.tokens, default=0)}/{max(first.tokens, default=0)}, "
          f"finish reasons {stops}")  # fmt: skip
    same = all(s.texts == runs[0].texts for s in runs[1:])
    print(f"same text under every setting: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
