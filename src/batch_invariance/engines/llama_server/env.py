"""The variables llama-server reads besides its ``LLAMA_ARG_*`` flags (pure).

ggml and its backends read ``GGML_*`` variables (fusion, tiling, device choice), the CUDA / HIP
/ Vulkan / SYCL runtimes and OpenMP / BLAS libraries read their own, and llama.cpp reads a few
``LLAMA_*`` switches (``LLAMA_GRAPH_REUSE_DISABLE`` ...): each can change what is computed
without showing in the argv. The dynamic loader's ``LD_PRELOAD`` / ``LD_LIBRARY_PATH`` change
which code runs at all.

This build (11434) also reads config files before its variables and the command line
(``common/arg.cpp``, ``common_params_apply_system_config``): ``/etc/llama.cpp/config.ini``,
then ``${XDG_CONFIG_HOME:-$HOME/.config}/llama.cpp/config.ini``. A server the tool starts
gets ``XDG_CONFIG_HOME=/dev/null`` (no user file can exist under it) and is refused when the
system-wide file exists.
"""

from __future__ import annotations

from collections.abc import Mapping

from batch_invariance.engines.llama_server.options import OPTION_VARIABLES

__all__ = [
    "ENGINE_ENV_NAMES",
    "ENGINE_ENV_PREFIXES",
    "NO_USER_CONFIG",
    "SYSTEM_CONFIG",
    "config_files",
    "engine_env",
    "is_engine_variable",
    "measured_env",
]


#: Variables with these prefixes are read by ggml, its backends' runtimes or llama.cpp.
ENGINE_ENV_PREFIXES = (
    "GGML_", "LLAMA_", "LLAMACPP_", "MTMD_", "CUDA_", "CUBLAS_", "NVIDIA_", "HIP_", "ROCR_",
    "HSA_", "ROCM_", "HCC_", "VK_", "ZE_", "ONEAPI_", "SYCL_", "OMP_", "KMP_", "GOMP_", "MKL_",
    "OPENBLAS_", "BLIS_", "SPACEMIT_",
)  # fmt: skip
#: Single variables with the same effect.
ENGINE_ENV_NAMES = frozenset({"LD_PRELOAD", "LD_LIBRARY_PATH"})
#: The system-wide config file this build reads.
SYSTEM_CONFIG = "/etc/llama.cpp/config.ini"
#: What the tool sets ``XDG_CONFIG_HOME`` to: nothing can exist under ``/dev/null``.
NO_USER_CONFIG = "/dev/null"


def is_engine_variable(name: str) -> bool:
    """True for a variable the server reads other than its ``LLAMA_ARG_*`` flags."""
    if name.startswith("LLAMA_ARG_") or name in OPTION_VARIABLES:
        return False  # an option's own variable: read (and compared) as that option
    return name in ENGINE_ENV_NAMES or name.startswith(ENGINE_ENV_PREFIXES)


def engine_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` the server or ggml read (not the flags), sorted by name."""
    return {k: env[k] for k in sorted(env) if is_engine_variable(k)}


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


def measured_env(parent: Mapping[str, str]) -> dict[str, str]:
    """The variables a server the tool starts (run-live, ``serve``) gets from ``parent``: none
    an option is read from (``LLAMA_ARG_*``, ``LLAMA_API_KEY`` ...), and
    ``XDG_CONFIG_HOME=/dev/null`` so that no user config file is read."""
    out = {
        k: v for k, v in parent.items() if not (k.startswith("LLAMA_ARG_") or k in OPTION_VARIABLES)
    }
    out["XDG_CONFIG_HOME"] = NO_USER_CONFIG
    return out
