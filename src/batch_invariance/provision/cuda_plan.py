"""The CUDA build of llama-server, planned without touching the host (pure).

:func:`pick_arch` chooses the one CUDA architecture to compile for (given, or read from the
GPUs' compute capability), :func:`parse_nvcc_release` reads ``nvcc --version``, and
:func:`cuda_build_plan` turns both into the cmake flags, the cache tag and the build identity
that the sidecar records and the binary's own ``--version`` line carries (as its commit field,
so a cert's ``provenance.server_binary.version`` names the CUDA release, architecture and flags).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from batch_invariance.errors import GuardRefused, UsageError

__all__ = [
    "ARCH_PATTERN",
    "NVCC_HINT",
    "CudaBuildPlan",
    "cuda_build_plan",
    "normalise_arch",
    "parse_nvcc_release",
    "pick_arch",
]

#: What ``--cuda-arch`` accepts: CMake's CUDA architecture numbers (``90``, ``89``, ``120a``).
ARCH_PATTERN = re.compile(r"^[1-9][0-9]{1,2}[af]?$")

#: What to install when there is no nvcc (the one-line refusal names it).
NVCC_HINT = (
    "install the CUDA toolkit (nvcc, cuBLAS; e.g. apt-get install nvidia-cuda-toolkit, or "
    "NVIDIA's cuda-toolkit-12-x package) and put its bin folder on PATH, or set CUDACXX to nvcc"
)

_RELEASE = re.compile(r"release\s+(\d+\.\d+)(?:,\s*V(\d+(?:\.\d+)+))?")


@dataclass(frozen=True)
class CudaBuildPlan:
    """Everything that names one CUDA build: its flags, cache tag and recorded identity."""

    arch: str
    cuda_version: str
    nvcc: str
    cmake_flags: tuple[str, ...]

    @property
    def flags_digest(self) -> str:
        """sha256 (first 12 hex) of the cmake flags that decide the binary (not nvcc's path,
        not the commit label that names this digest)."""
        skip = ("-DCMAKE_CUDA_COMPILER=", "-DLLAMA_BUILD_COMMIT=")
        text = "\n".join(f for f in self.cmake_flags if not f.startswith(skip))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        """The cache folder tag: a build with other flags, arch or toolkit never shares one."""
        return f"cuda{self.cuda_version}-sm{self.arch}-{self.flags_digest[:8]}"

    @property
    def commit_label(self) -> str:
        """What the binary prints as its commit (no spaces: cmake reads it unquoted)."""
        return f"sdist+cuda{self.cuda_version}+sm{self.arch}+flags{self.flags_digest[:8]}"

    def identity(self) -> dict[str, object]:
        """The build identity the sidecar records (``build`` key)."""
        return {
            "backend": "cuda",
            "cuda_version": self.cuda_version,
            "cuda_architectures": [self.arch],
            "nvcc": self.nvcc,
            "cmake_flags": list(self.cmake_flags),
            "flags_sha256_12": self.flags_digest,
            "commit_label": self.commit_label,
        }


def normalise_arch(given: str) -> str:
    """``9.0`` (a compute capability) or ``90`` (a CMake architecture) as ``90``; else a
    :class:`UsageError` naming the accepted forms."""
    text = given.strip()
    if re.fullmatch(r"[1-9][0-9]?\.[0-9]", text):
        text = text.replace(".", "")
    if not ARCH_PATTERN.match(text):
        raise UsageError(
            f"--cuda-arch {given!r} is not a CUDA architecture; give one like 90 (H100/H200), "
            "89 (L4/L40) or 80 (A100), or a compute capability like 9.0"
        )
    return text


def pick_arch(given: str | None, compute_caps: Sequence[str] | None) -> str:
    """The one architecture to build for: ``given`` when set, else the GPUs' compute capability
    (all GPUs must agree). Raises :class:`GuardRefused` when it cannot be read, naming
    ``--cuda-arch``."""
    if given is not None:
        return normalise_arch(given)
    if compute_caps is None:
        raise GuardRefused(
            "provision --backend cuda: no nvidia-smi here to read the GPU's compute capability; "
            "pass --cuda-arch (e.g. --cuda-arch 90 for an H100/H200)"
        )
    caps = sorted({c.strip() for c in compute_caps if c.strip()})
    if not caps or any(not re.fullmatch(r"\d+\.\d+", c) for c in caps):
        raise GuardRefused(
            f"provision --backend cuda: nvidia-smi names no readable compute capability "
            f"({', '.join(caps) or 'no GPU listed'}); pass --cuda-arch (e.g. 90)"
        )
    if len(caps) > 1:
        raise GuardRefused(
            f"provision --backend cuda: the GPUs differ in compute capability ({', '.join(caps)}) "
            "and one architecture is built; pass --cuda-arch for the GPU the server will use"
        )
    return normalise_arch(caps[0])


def parse_nvcc_release(text: str) -> str | None:
    """The CUDA release ``nvcc --version`` names: ``13.0.88`` (``V`` form) or ``12.4``."""
    m = _RELEASE.search(text)
    if m is None:
        return None
    return m.group(2) or m.group(1)


def cuda_build_plan(
    base_flags: Sequence[str], arch: str, cuda_version: str, nvcc: str
) -> CudaBuildPlan:
    """The CPU build's flags (portable kernels, static, server only) plus the CUDA backend for
    exactly one architecture, compiled by exactly the ``nvcc`` found; the build identity goes
    into the binary's ``--version`` as its commit label."""
    arch = normalise_arch(arch)
    cuda = (
        "-DGGML_CUDA=ON",
        f"-DCMAKE_CUDA_ARCHITECTURES={arch}",
        f"-DCMAKE_CUDA_COMPILER={nvcc}",
    )
    draft = CudaBuildPlan(arch, cuda_version, nvcc, (*base_flags, *cuda))
    label = f"-DLLAMA_BUILD_COMMIT={draft.commit_label}"
    return CudaBuildPlan(arch, cuda_version, nvcc, (*draft.cmake_flags, label))
