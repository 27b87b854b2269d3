"""Engines that run from a pinned venv in the cache: one way to install, verify and reuse them.

A :class:`PinnedVenv` names what goes into ``<cache>/<folder>/venv`` (the pip steps, the
packages to remove afterwards), the probe that says what the venv imports, and a marker
(``<cache>/<folder>/<marker_file>``) that records how it was installed. :func:`ensure_venv`
reuses the venv only when the probe prints the pinned version and the marker matches;
otherwise it builds it (one progress line per step, the log in ``<cache>/<folder>/build.log``).
A package pip cannot find is a one-line :class:`InfraError` that names it and where it comes
from.

``provision --engine llama-cpp-python`` installs the pinned ``llama-cpp-python[server]``,
which builds its vendored llama.cpp from source (a long build on few cores). vLLM's venvs are
in :mod:`batch_invariance.provision.vllm`. SGLang is not provisioned: it needs a GPU
host, where the operator installs it and names its Python with --server-bin.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from batch_invariance.errors import InfraError
from batch_invariance.provision.embedded import Layout, Say, locked, run_logged, say_stderr

__all__ = [
    "CMAKE_ARGS",
    "LLAMA_CPP_PYTHON_REQUIREMENT",
    "LLAMA_CPP_PYTHON_VERSION",
    "EngineVenv",
    "PinnedVenv",
    "PipStep",
    "ensure_llama_cpp_python",
    "ensure_venv",
    "installed_version",
    "llama_cpp_python_venv",
    "venv_dir",
]


LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_PYTHON_REQUIREMENT = f"llama-cpp-python[server]=={LLAMA_CPP_PYTHON_VERSION}"
#: A portable CPU build: a native one enables AMX where the CPU flags it, and AMX kernels
#: crash (SIGSEGV on the first completion) in VMs that advertise AMX but do not enable it.
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"

_NOT_FOUND = re.compile(r"No matching distribution found for (\S+)")


@dataclass(frozen=True)
class PipStep:
    """One ``pip install`` of ``requirements``; ``note`` goes on its progress line."""

    requirements: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class PinnedVenv:
    """A venv in the cache with pinned contents (see the module docstring)."""

    #: The cache sub-folder (``<cache>/<folder>/venv``).
    folder: str
    #: What it is, for messages (``llama-cpp-python 0.3.36``).
    title: str
    steps: tuple[PipStep, ...]
    #: Python code that prints the version the venv holds (the reuse check).
    probe: str
    version: str
    #: The ``provision`` command that makes it (named in every error).
    provision_command: str
    marker_file: str = "installed.txt"
    #: Written to the marker after a good install; a venv with another marker is rebuilt.
    marker: str = ""
    #: Packages removed after the install (they break the engine's import).
    remove: tuple[str, ...] = ()
    #: Python code run once after the install (a slow import the probe leaves out).
    check: str = ""
    pip_env: Mapping[str, str] = field(default_factory=dict)
    #: Where a requirement pip could not find comes from (a prefix of it -> the hint).
    sources: Mapping[str, str] = field(default_factory=dict)

    def home(self, layout: Layout) -> Path:
        return layout.root / self.folder

    def python(self, layout: Layout) -> Path:
        return self.home(layout) / "venv" / "bin" / "python"

    def recorded(self) -> str:
        """The marker text: the caller's marker, else every pip step and removal."""
        if self.marker:
            return self.marker
        lines = [" ".join(s.requirements) for s in self.steps]
        return "\n".join([*lines, *(f"-{name}" for name in self.remove)])


@dataclass(frozen=True)
class EngineVenv:
    """A provisioned engine: the interpreter to pass as ``--server-bin``, and how it came."""

    python: Path
    version: str
    #: "reused" or "built".
    origin: str


def installed_version(python: Path, probe: str, timeout_s: float = 180.0) -> str | None:
    """What ``probe`` prints under ``python`` (the imported version), or ``None``."""
    if not python.is_file():
        return None
    try:
        done = subprocess.run(
            [str(python), "-c", probe], capture_output=True, text=True, timeout=timeout_s,
            stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[-1].strip() if done.returncode == 0 and lines else None


def _pip_not_found(log: Path, spec: PinnedVenv) -> InfraError | None:
    """A one-line error naming the requirement pip could not find, from the pip log."""
    found = _NOT_FOUND.findall(log.read_text(errors="replace"))
    if not found:
        return None
    req = found[-1]
    hint = next((h for prefix, h in spec.sources.items() if req.startswith(prefix)), None)
    where = hint or "check the network, PIP_INDEX_URL or PIP_EXTRA_INDEX_URL"
    return InfraError(
        f"pip found no {req} for {spec.title}: {where}; then rerun `{spec.provision_command}` "
        f"(log {log})"
    )


def _build(spec: PinnedVenv, layout: Layout, say: Say) -> None:
    home = spec.home(layout)
    home.mkdir(parents=True, exist_ok=True)
    (home / spec.marker_file).unlink(missing_ok=True)
    log = home / "build.log"
    python = spec.python(layout)
    say(f"creating the venv {home / 'venv'} for {spec.title} (log {log})")
    run_logged([sys.executable, "-m", "venv", "--clear", str(home / "venv")], log, "the venv")
    for step in spec.steps:
        say(f"pip install {' '.join(step.requirements)}{f' ({step.note})' if step.note else ''}")
        try:
            run_logged(
                [str(python), "-m", "pip", "install", "--no-cache-dir", *step.requirements],
                log, f"pip install {' '.join(step.requirements)}", spec.pip_env,
            )  # fmt: skip
        except InfraError as exc:
            raise (_pip_not_found(log, spec) or exc) from None
    if spec.remove:
        say(f"pip uninstall {' '.join(spec.remove)} (they break the engine's import)")
        run_logged([str(python), "-m", "pip", "uninstall", "-y", *spec.remove], log, "uninstall")
    if spec.check:
        say(f"checking that the venv imports what it must: {spec.check}")
        run_logged([str(python), "-c", spec.check], log, f"`{spec.check}`")


def ensure_venv(
    spec: PinnedVenv, layout: Layout, *, allow_build: bool = True, say: Say = say_stderr
) -> EngineVenv:
    """Reuse or build ``spec``'s venv (under its own lock in the cache)."""
    home = spec.home(layout)
    python = spec.python(layout)
    with locked(layout.root / f"{spec.folder}.lock"):
        marker = home / spec.marker_file
        recorded = marker.read_text().strip() if marker.is_file() else None
        if recorded == spec.recorded() and installed_version(python, spec.probe) == spec.version:
            return EngineVenv(python, spec.version, "reused")
        if not allow_build:
            raise InfraError(
                f"{spec.title} is not in {home}; run `{spec.provision_command}` (it installs it)"
            )
        _build(spec, layout, say)
        version = installed_version(python, spec.probe)
        if version != spec.version:
            raise InfraError(
                f"{python} imports {spec.title.split()[0]} {version}, not {spec.version}"
            )
        marker.write_text(spec.recorded() + "\n")
        return EngineVenv(python, spec.version, "built")


def llama_cpp_python_venv(jobs: int | None = None) -> PinnedVenv:
    """The pinned ``llama-cpp-python[server]`` venv (a portable from-source build)."""
    return PinnedVenv(
        folder=f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}",
        title=f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}",
        steps=(PipStep(("--force-reinstall", LLAMA_CPP_PYTHON_REQUIREMENT), "builds from source"),),
        probe="import llama_cpp, llama_cpp.server; print(llama_cpp.__version__)",
        version=LLAMA_CPP_PYTHON_VERSION,
        provision_command="batch-invariance provision --engine llama-cpp-python",
        marker_file="build-flags.txt",
        marker=CMAKE_ARGS,
        pip_env={
            "CMAKE_ARGS": CMAKE_ARGS,
            "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs or os.cpu_count()),
        },
    )


def venv_dir(layout: Layout) -> Path:
    return llama_cpp_python_venv().home(layout)


def ensure_llama_cpp_python(
    layout: Layout, *, allow_build: bool = True, jobs: int | None = None, say: Say = say_stderr
) -> EngineVenv:
    """Reuse or build the llama-cpp-python venv (long: it builds llama.cpp from source)."""
    return ensure_venv(llama_cpp_python_venv(jobs), layout, allow_build=allow_build, say=say)
