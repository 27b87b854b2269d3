"""``provision --engine llama-cpp-python``: pinned ``llama-cpp-python[server]`` in a cached venv.

The package builds its vendored llama.cpp from source (a long build on few cores), so the venv
lives in the cache folder, ``<cache>/llama-cpp-python-<version>/venv``, and is reused once
its interpreter imports ``llama_cpp.server`` at the pinned version and ``build-flags.txt``
names the pinned (portable, no AMX) CMake flags. The build log is
``<cache>/llama-cpp-python-<version>/build.log``. vLLM and SGLang are not provisioned: they
need a GPU host, where the operator installs them and names the executable with --server-bin.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.engines.provision import Layout, Say, locked, run_logged, say_stderr
from batch_invariance.errors import InfraError

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_PYTHON_REQUIREMENT = f"llama-cpp-python[server]=={LLAMA_CPP_PYTHON_VERSION}"
#: A portable CPU build: a native one enables AMX where the CPU flags it, and AMX kernels
#: crash (SIGSEGV on the first completion) in VMs that advertise AMX but do not enable it.
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
_PROBE = "import llama_cpp, llama_cpp.server; print(llama_cpp.__version__)"


@dataclass(frozen=True)
class EngineVenv:
    """A provisioned engine: the interpreter to pass as ``--server-bin``, and how it came."""

    python: Path
    version: str
    #: "reused" or "built".
    origin: str


def venv_dir(layout: Layout) -> Path:
    return layout.root / f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}"


def installed_version(python: Path, timeout_s: float = 60.0) -> str | None:
    """The ``llama_cpp`` version ``python`` imports with its server, or ``None``."""
    if not python.is_file():
        return None
    try:
        done = subprocess.run(
            [str(python), "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s,
            stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_llama_cpp_python(
    layout: Layout, *, allow_build: bool = True, jobs: int | None = None, say: Say = say_stderr
) -> EngineVenv:
    """Reuse or build the venv (under the cache's provision lock)."""
    home = venv_dir(layout)
    python = home / "venv" / "bin" / "python"
    with locked(layout.root / "llama-cpp-python.lock"):
        marker = home / "build-flags.txt"
        built_with = marker.read_text().strip() if marker.is_file() else None
        if built_with == CMAKE_ARGS and installed_version(python) == LLAMA_CPP_PYTHON_VERSION:
            return EngineVenv(python, LLAMA_CPP_PYTHON_VERSION, "reused")
        if not allow_build:
            raise InfraError(
                f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} is not in {home}; run "
                "`batch-invariance provision --engine llama-cpp-python` (it builds from source)"
            )
        home.mkdir(parents=True, exist_ok=True)
        log = home / "build.log"
        say(f"building {LLAMA_CPP_PYTHON_REQUIREMENT} into {home} (long; log {log})")
        run_logged([sys.executable, "-m", "venv", str(home / "venv")], log, "creating the venv")
        run_logged(
            [str(python), "-m", "pip", "install", "--no-cache-dir", "--force-reinstall",
             LLAMA_CPP_PYTHON_REQUIREMENT],
            log, f"pip install {LLAMA_CPP_PYTHON_REQUIREMENT}",
            {"CMAKE_ARGS": CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs or os.cpu_count())},
        )  # fmt: skip
        version = installed_version(python)
        if version != LLAMA_CPP_PYTHON_VERSION:
            raise InfraError(
                f"{python} imports llama_cpp {version}, not {LLAMA_CPP_PYTHON_VERSION}"
            )
        marker.write_text(CMAKE_ARGS + "\n")
        return EngineVenv(python, version, "built")
