"""The variables llama-server reads besides its ``LLAMA_ARG_*`` flags (pure).

ggml and its backends read ``GGML_*`` variables (fusion, tiling, device choice), the CUDA / HIP
/ Vulkan / SYCL runtimes and OpenMP / BLAS libraries read their own, and llama.cpp reads a few
``LLAMA_*`` switches (``LLAMA_GRAPH_REUSE_DISABLE`` ...): each can change what is computed
without showing in the argv. The dynamic loader's ``LD_PRELOAD`` / ``LD_LIBRARY_PATH`` change
which code runs at all.

ggml's and llama.cpp's own variables (:data:`ALWAYS_READ_PREFIXES`) are read by every build; a
runtime's (:data:`RUNTIMES`: ``OPENBLAS_*``, ``CUDA_*``, ``OMP_*`` ...) only by a build that
links it, as :mod:`batch_invariance.engines.llama_server.linked` reads from the build's files.
A server gets, and its cert records, only the variables its build can read: a host that sets
``OPENBLAS_CORETYPE`` measures a build without OpenBLAS as if it did not.

This build (11434) also reads config files before its variables and the command line
(``common/arg.cpp``, ``common_params_apply_system_config``): ``/etc/llama.cpp/config.ini``,
then ``${XDG_CONFIG_HOME:-$HOME/.config}/llama.cpp/config.ini``. A server the tool starts
gets ``XDG_CONFIG_HOME=/dev/null`` (no user file can exist under it) and is refused when the
system-wide file exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from batch_invariance.core.gpu_placement import is_gpu_selection
from batch_invariance.engines.llama_server.options import OPTION_VARIABLES
from batch_invariance.engines.variables import (
    NEUTRAL_ENV_NAMES,
    NO_USER_CONFIG,
    EnvRules,
    Linked,
    Runtime,
    is_neutral_variable,
)

__all__ = [
    "ALWAYS_READ_PREFIXES",
    "ENGINE_ENV_NAMES",
    "ENGINE_ENV_PREFIXES",
    "LLAMA_CPP_ENV",
    "NEUTRAL_ENV_NAMES",
    "NO_USER_CONFIG",
    "RUNTIMES",
    "SYSTEM_CONFIG",
    "ServedEnv",
    "config_files",
    "engine_env",
    "is_engine_variable",
    "is_neutral_variable",
    "is_option_variable",
    "measured_env",
    "served_env",
]


#: Variables with these prefixes are read by every build: ggml's, llama.cpp's, its multimodal
#: library's and ggml's SpacemiT CPU kernels' (compiled in, no library to link).
ALWAYS_READ_PREFIXES = ("GGML_", "LLAMA_", "LLAMACPP_", "MTMD_", "SPACEMIT_")
#: The libraries a build may link, and the variables each reads once linked (a BLAS library
#: may bring its own OpenMP runtime).
RUNTIMES = (
    Runtime("CUDA", ("libcuda", "libcublas", "libnvrtc", "libnccl"),
            ("CUDA_", "CUBLAS_", "NVIDIA_")),
    Runtime("ROCm", ("libamdhip", "libhip", "librocblas", "librocm", "libhsa-runtime"),
            ("HIP_", "ROCR_", "HSA_", "ROCM_", "HCC_")),
    Runtime("Vulkan", ("libvulkan",), ("VK_",)),
    Runtime("oneAPI", ("libsycl", "libze_loader", "libur_loader", "libmkl_sycl", "libdnnl"),
            ("ZE_", "ONEAPI_", "SYCL_")),
    Runtime("OpenMP", ("libgomp", "libomp", "libiomp"), ("OMP_", "KMP_", "GOMP_")),
    Runtime("MKL", ("libmkl_",), ("MKL_",), brings=("OpenMP",)),
    Runtime("OpenBLAS", ("libopenblas",), ("OPENBLAS_",), brings=("OpenMP",)),
    Runtime("BLIS", ("libblis",), ("BLIS_",), brings=("OpenMP",)),
)  # fmt: skip
#: Every prefix some build reads (a build not read: all of them).
ENGINE_ENV_PREFIXES = ALWAYS_READ_PREFIXES + tuple(p for r in RUNTIMES for p in r.prefixes)
#: Single variables with the same effect.
ENGINE_ENV_NAMES = frozenset({"LD_PRELOAD", "LD_LIBRARY_PATH"})
#: The system-wide config file this build reads.
SYSTEM_CONFIG = "/etc/llama.cpp/config.ini"

#: llama.cpp's variables: what ggml, its backends' runtimes and llama.cpp read, its
#: ``LLAMA_ARG_*`` (and other option) variables, and its system-wide config file.
LLAMA_CPP_ENV = EnvRules(
    read_prefixes=ALWAYS_READ_PREFIXES,
    read_names=ENGINE_ENV_NAMES,
    runtimes=RUNTIMES,
    option_prefixes=("LLAMA_ARG_",),
    option_names=OPTION_VARIABLES,
    system_configs=(SYSTEM_CONFIG,),
)


def is_option_variable(name: str) -> bool:
    """A variable llama-server reads as one of its options (compared as that option)."""
    return LLAMA_CPP_ENV.is_option_variable(name)


def is_engine_variable(name: str, linked: Linked = None) -> bool:
    """True for a variable the server reads other than its ``LLAMA_ARG_*`` flags and the
    GPU-selection variables (placement: what they select is recorded, not their values);
    a runtime's only where the build links it (``linked``; ``None``: not known, any)."""
    return LLAMA_CPP_ENV.is_engine_variable(name, linked)


def engine_env(env: Mapping[str, str], linked: Linked = None) -> dict[str, str]:
    """The variables of ``env`` the server or ggml read (not the flags), sorted by name; a
    runtime's only where the build links it (``linked``; ``None``: not known, every one)."""
    return LLAMA_CPP_ENV.engine_env(env, linked)


def config_files(env: Mapping[str, str], home: str | None) -> tuple[str, ...]:
    """The config files a server with ``env`` would read, in order (whether they exist is
    for the caller to look). ``home`` is the server user's home when ``env`` has no HOME."""
    out = [SYSTEM_CONFIG]
    base = env.get("XDG_CONFIG_HOME") or None
    if base is None:
        home = env.get("HOME") or home
        base = f"{home.rstrip('/')}/.config" if home else None
    if base is not None:
        out.append(f"{base.rstrip('/')}/llama.cpp/config.ini")
    return tuple(out)


def measured_env(parent: Mapping[str, str], linked: Linked = None) -> dict[str, str]:
    """The variables a server the tool measures gets from ``parent``
    (:meth:`~batch_invariance.engines.variables.EnvRules.measured_env` of llama.cpp's)."""
    return LLAMA_CPP_ENV.measured_env(parent, linked)


@dataclass(frozen=True)
class ServedEnv:
    """The variables ``serve`` execs the measured server with, or why it will not."""

    env: dict[str, str]
    #: Variables the caller sets to another value than the cert recorded (refused).
    refused: tuple[str, ...]
    #: Variables of the caller that are dropped (named, not an error).
    dropped: tuple[str, ...]


def served_env(parent: Mapping[str, str], recorded: Mapping[str, str]) -> ServedEnv:
    """The same rule as :func:`measured_env`, for a server started from a cert: the caller's
    neutral and GPU-selection variables (where this server runs is the caller's choice) plus
    exactly the engine variables the cert recorded; a caller's value that differs from a
    recorded one is refused; every other variable is dropped. A selection variable an older
    cert recorded is not re-applied."""
    recorded = {k: v for k, v in recorded.items() if is_engine_variable(k)}
    refused = tuple(
        f"{k}={parent[k]} (the cert recorded {k}={recorded[k]})"
        for k in sorted(recorded)
        if k in parent and parent[k] != recorded[k]
    )
    env = {k: v for k, v in parent.items() if is_neutral_variable(k) or is_gpu_selection(k)}
    env.update(recorded)
    env["XDG_CONFIG_HOME"] = NO_USER_CONFIG
    dropped = tuple(sorted(k for k in parent if k not in env))
    return ServedEnv(env, refused, dropped)
