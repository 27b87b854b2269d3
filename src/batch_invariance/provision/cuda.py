"""``provision --backend cuda``: llama-server from the same pinned sdist, with ``GGML_CUDA=ON``.

The host half of :mod:`batch_invariance.provision.cuda_plan`: find ``nvcc`` (``$CUDACXX``, else
``PATH``; refused in one line naming what to install when there is none), read its release,
read the GPUs' compute capability from ``nvidia-smi`` (unless ``--cuda-arch`` is given), then
build the server target only into its own cache folder (``<cache>/llama-server/<version>-<tag>``,
tag ``cuda<release>-sm<arch>-<flags>``), never the CPU build's. The sidecar beside the binary
records the build identity (CUDA release, architecture, cmake flags, nvcc), and the binary's
``--version`` carries it as its commit label, which every cert records as
``provenance.server_binary.version``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.errors import GuardRefused, InfraError
from batch_invariance.host.gpus import list_gpus
from batch_invariance.provision.cuda_plan import (
    NVCC_HINT,
    CudaBuildPlan,
    cuda_build_plan,
    parse_nvcc_release,
    pick_arch,
)
from batch_invariance.provision.embedded import (
    CMAKE_FLAGS,
    Layout,
    Say,
    ensure_server,
    locked,
    say_stderr,
)

__all__ = ["CudaProvisioned", "find_nvcc", "gpu_compute_caps", "nvcc_release", "provision_cuda"]


@dataclass(frozen=True)
class CudaProvisioned:
    """A ready CUDA llama-server and the plan that named its build."""

    server_bin: Path
    server_sha256: str
    #: "reused", "adopted" or "built" (as for the CPU build).
    server_origin: str
    plan: CudaBuildPlan
    sidecar: Path


def find_nvcc(env: Mapping[str, str]) -> Path | None:
    """``$CUDACXX`` when it names an executable, else ``nvcc`` on ``env``'s ``PATH``."""
    given = env.get("CUDACXX")
    if given and os.access(given, os.X_OK):
        return Path(given)
    found = shutil.which("nvcc", path=env.get("PATH", ""))
    return Path(found) if found else None


def nvcc_release(nvcc: Path) -> str:
    """The CUDA release ``nvcc --version`` names (``13.0.88``); :class:`InfraError` when it
    does not run or names none."""
    try:
        out = subprocess.run(
            [str(nvcc), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise InfraError(f"{nvcc} --version did not run ({exc}); {NVCC_HINT}") from None
    release = parse_nvcc_release(out.stdout + out.stderr)
    if out.returncode != 0 or release is None:
        first = (out.stdout + out.stderr).strip().splitlines()
        raise InfraError(
            f"{nvcc} --version exited {out.returncode} naming no CUDA release "
            f"({first[0] if first else 'no output'}); {NVCC_HINT}"
        )
    return release


def gpu_compute_caps() -> list[str] | None:
    """Each GPU's compute capability from ``nvidia-smi`` (``None``: no nvidia-smi here)."""
    try:
        gpus = list_gpus()
    except Exception as exc:  # host.gpus' unread case: nvidia-smi there but not answering
        raise GuardRefused(
            f"provision --backend cuda: nvidia-smi did not answer ({exc}); "
            "pass --cuda-arch (e.g. 90)"
        ) from None
    if gpus is None:
        return None
    return [g.compute_cap or "" for g in gpus]


def plan_here(arch: str | None, env: Mapping[str, str]) -> CudaBuildPlan:
    """The build plan on this host: refused in one line (:class:`GuardRefused`, nothing ran)
    without nvcc, or without ``--cuda-arch`` where the GPUs cannot be read."""
    nvcc = find_nvcc(env)
    if nvcc is None:
        raise GuardRefused(f"provision --backend cuda: no nvcc on PATH (nor $CUDACXX); {NVCC_HINT}")
    chosen = pick_arch(arch, None if arch is not None else gpu_compute_caps())
    return cuda_build_plan(CMAKE_FLAGS, chosen, nvcc_release(nvcc), str(nvcc))


def provision_cuda(
    cache: Path,
    arch: str | None = None,
    *,
    allow_build: bool = True,
    jobs: int | None = None,
    say: Say = say_stderr,
    env: Mapping[str, str] | None = None,
) -> CudaProvisioned:
    """Make sure the CUDA llama-server for this host's (or the given) architecture exists."""
    plan = plan_here(arch, os.environ if env is None else env)
    if shutil.which("cmake") is None:
        raise GuardRefused(
            "provision --backend cuda: no cmake on PATH; install cmake and a C++ compiler "
            "(e.g. apt-get install cmake g++ ninja-build)"
        )
    layout = Layout(cache, tag=plan.tag)
    say(f"CUDA {plan.cuda_version}, sm_{plan.arch}: {layout.server_bin.parent.parent}")
    with locked(layout.lock):
        server, digest, origin = ensure_server(
            layout, say, allow_build, jobs, plan.cmake_flags, plan.identity()
        )
    return CudaProvisioned(server, digest, origin, plan, layout.server_sidecar)
