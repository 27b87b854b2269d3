"""Which server a live cell measures, checked once: the engine (``--engine``), and either the
binary and model the tool launches or the URL of a server it attaches to (``--base-url``).

:func:`resolve_target` resolves what ``LiveRequest.check`` could not check cheaply (usage
errors, one line each): the attach URL, the binary and the model. The GGUF header is read
where the engine loads a GGUF file (llama-server, llama-cpp-python); an engine that loads a
Hugging Face model folder (vLLM, SGLang) gets no header and the reason recorded; where it
reserves a share of its memory node at start (vLLM), the folder's config and weight files are
read so the guard can size it. What differs between engines (how the binary is resolved) is
asked of the engine. :func:`make_launcher` picks the launcher: :class:`EngineLauncher` for a
launched engine, ``AttachLauncher`` for an attached server. :func:`identify` records what ran.

What binary ran: :func:`identify_binary` records a server binary's sha256 and ``--version``
for the cert, before the cell starts, and the sha256 of each library of the engine's own build
it loads from beside it (:meth:`~batch_invariance.engines.base.Engine.build_libraries`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from batch_invariance.cache_dir import cache_root
from batch_invariance.cert.provenance import BinaryRecord
from batch_invariance.core.roles import ServerRole
from batch_invariance.engines.base import Engine, MemoryReservation
from batch_invariance.errors import UsageError
from batch_invariance.host import memory
from batch_invariance.host.facts import cached_sha256
from batch_invariance.host.gguf import GgufInfo, parse_info
from batch_invariance.host.hf_model import HfModelInfo, read_hf_model
from batch_invariance.profiles.overrides import ProfileRun
from batch_invariance.run.records import ServerLauncher
from batch_invariance.servers import ports
from batch_invariance.servers.attach import AttachLauncher, AttachTarget, attach_target
from batch_invariance.servers.launch import EngineLauncher, LaunchRecord
from batch_invariance.service.options import LaunchOptions

if TYPE_CHECKING:
    from batch_invariance.service.request import LiveRequest


import contextlib
import signal
import subprocess

from batch_invariance.host.facts import sha256_file

ATTACHED_NO_GGUF = "attached: the tool did not start the server and reads no model file"


class LiveServerLauncher(ServerLauncher, Protocol):
    """What a live cell needs of its launcher besides starting servers: the launches it
    made, why one was aborted, and the memory guard on the server it would start."""

    launches: list[LaunchRecord]
    aborted: str | None

    def guard_decision(
        self,
        parallel: int,
        ctx: int,
        host: memory.HostMemory,
        role: ServerRole = ServerRole.BC,
    ) -> memory.GuardDecision | None:
        """``None`` where no guard applies (no model to project, or an attached server)."""


@dataclass(frozen=True)
class ServerTarget:
    """The checked server side of a live cell."""

    engine: Engine
    #: ``None`` when attached (the tool starts nothing).
    server_bin: Path | None
    #: The model file or folder; attached: only what the user named, if anything.
    model: Path | None
    #: The GGUF header, where the engine loads a GGUF file the tool launches.
    gguf: GgufInfo | None
    #: Why no GGUF header was read (``None`` when it was).
    gguf_skipped: str | None
    attach: AttachTarget | None
    server_flags: tuple[str, ...]
    #: A model folder's sizes, where the engine reserves a share of its memory node at start.
    hf_model: HfModelInfo | None = None
    #: How that engine reserves it (the user's own value, if any, checked by the guard).
    reservation: MemoryReservation | None = None


def _check_file(path: Path | None, flag: str, what: str, executable: bool = False) -> Path:
    if path is None:
        raise UsageError(f"{flag} is required ({what})")
    if not path.is_file():
        raise UsageError(f"{flag} {path}: no such file")
    if executable and not os.access(path, os.X_OK):
        raise UsageError(f"{flag} {path}: not executable (chmod +x it)")
    return path


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


def resolve_target(request: LiveRequest, engine: Engine, prof: ProfileRun | None) -> ServerTarget:
    """Resolve the server side of a request ``LiveRequest.check`` passed, for ``engine``
    (UsageError naming the first problem): the attach URL, or the binary, the model and its
    GGUF header."""
    flags = tuple(prof.server_flags if prof else request.server_flags)
    a = request.attach
    if a.base_url is None:
        return _launched_target(request, engine, prof, flags)
    attach = attach_target(a.base_url, a.metrics_url, a.allow_remote)
    return ServerTarget(engine, None, request.model, None, ATTACHED_NO_GGUF, attach, flags)


def _launched_target(
    request: LiveRequest, engine: Engine, prof: ProfileRun | None, flags: tuple[str, ...]
) -> ServerTarget:
    server_bin = request.server_bin or (_path(prof.server_bin) if prof else None)
    model = request.model or (_path(prof.model) if prof else None)
    # Without a profile that could name them, both must be given.
    if not engine.takes_profiles and (server_bin is None or model is None):
        raise UsageError(
            f"--server-bin and --model are required for --engine {engine.name} "
            "(its executable or Python interpreter, and its model)"
        )
    server_bin = _check_file(server_bin, "--server-bin", engine.binary_hint, executable=True)
    launcher = engine.resolve_binary(server_bin)
    if engine.loads_gguf:
        model = _check_file(model, "--model", "path to a GGUF model")
        return ServerTarget(engine, launcher, model.resolve(), parse_info(model), None, None, flags)
    if model is None or not model.exists():
        raise UsageError(f"--model {model}: no such file or folder")
    reservation = engine.memory_reservation(flags, os.environ)
    hf = None if reservation is None else read_hf_model(model)
    guard = "the memory guard reads its config.json" if hf else "no memory guard"
    skipped = (
        f"engine {engine.name} loads a Hugging Face model folder: no GGUF header read; {guard}"
    )
    return ServerTarget(
        engine, launcher, model.resolve(), None, skipped, None, flags, hf, reservation
    )


class LauncherFactory(Protocol):
    """Builds a live cell's launcher (:func:`make_launcher`; a test passes its own, e.g.
    :func:`engine_launcher` with ``cap_parallel``)."""

    def __call__(
        self, target: ServerTarget, options: LaunchOptions, log_dir: Path, policy: ports.PortPolicy
    ) -> LiveServerLauncher: ...


def make_launcher(
    target: ServerTarget, options: LaunchOptions, log_dir: Path, policy: ports.PortPolicy
) -> LiveServerLauncher:
    """The launcher for ``target``: attached, or the engine launched by the tool."""
    if target.attach is not None:
        return AttachLauncher(target.attach, target.engine)
    return engine_launcher(target, options, log_dir, policy)


def engine_launcher(
    target: ServerTarget,
    options: LaunchOptions,
    log_dir: Path,
    policy: ports.PortPolicy,
    *,
    cap_parallel: int | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> EngineLauncher:
    """The launcher that starts ``target``'s engine (a launched target only).

    ``cap_parallel`` is for tests (see :class:`LauncherFactory`): every server then gets at
    most that many slots, so it cannot co-batch. ``extra_env``: engine variables set over this
    process's for the servers (a search configuration's, e.g. vLLM's batch-invariant mode)."""
    if target.server_bin is None or target.model is None:
        raise UsageError("an attached server has no launcher: the tool starts nothing there")
    return EngineLauncher(
        target.engine, target.server_bin, target.model, log_dir, port_policy=policy,
        server_flags=target.server_flags, env={**os.environ, **(extra_env or {})},
        ready_timeout=options.ready_timeout, gguf=target.gguf,
        max_footprint_gb=options.max_footprint_gb, cap_parallel=cap_parallel,
        kv_layout=options.kv_layout, prompt_cache=options.prompt_cache,
        hf_model=target.hf_model, reservation=target.reservation,
    )  # fmt: skip


@dataclass(frozen=True)
class TargetIdentity:
    """What ran, recorded before the cell: the binary and the model file's sha256 (``None``
    where there is no launched binary, or the model is a folder)."""

    binary: BinaryIdentity | None
    model_sha256: str | None


def identify(target: ServerTarget) -> TargetIdentity:
    """sha256 and ``--version`` of the launched binary, and the model file's (cached) sha256."""
    server_bin = target.server_bin
    binary = None if server_bin is None else identify_binary(server_bin, target.engine)
    model = target.model if target.attach is None else None
    sha = cached_sha256(model, cache_root() / "hashes.json") if model and model.is_file() else None
    return TargetIdentity(binary, sha)


@dataclass(frozen=True)
class BinaryIdentity:
    """What the cert records about the server binary."""

    path: str
    sha256: str
    version: str
    version_rc: int | None
    #: (path beside it, sha256) of each library of ``engine``'s own build it loads; ``None``:
    #: not recorded (no engine given, a binary it cannot read, a library it cannot hash).
    libraries: tuple[tuple[str, str], ...] | None = None

    def record(self) -> BinaryRecord:
        """``provenance.server_binary``; ``libraries`` absent where not recorded (as in a
        cert written before they were)."""
        record: dict[str, Any] = {
            "path": self.path, "sha256": self.sha256, "version": self.version,
            "version_rc": self.version_rc,
        }  # fmt: skip
        if self.libraries is not None:
            record["libraries"] = [{"path": name, "sha256": sha} for name, sha in self.libraries]
        return BinaryRecord.from_record(record)


def identify_binary(
    server_bin: Path, engine: Engine | None = None, timeout_s: float = 15.0
) -> BinaryIdentity:
    """sha256 and ``--version`` of a server binary, and its libraries (``engine``'s own).

    A failing ``--version`` is recorded, not raised: the launch itself reports a broken binary
    with its log tail.
    """
    digest = sha256_file(server_bin)
    found = None if engine is None else engine.build_libraries(server_bin, sha256_file)
    libraries = None if found is None or found.unread else found.sha256
    try:
        # Own process group: a --version that hangs is killed with everything it spawned,
        # and nothing outside that group is touched.
        proc = subprocess.Popen(
            [str(server_bin), "--version"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        return BinaryIdentity(
            path=str(server_bin),
            sha256=digest,
            version=f"(--version failed: {exc})",
            version_rc=None,
            libraries=libraries,
        )
    try:
        text, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        version, rc = f"(--version did not finish within {timeout_s:g} s)", None
    else:
        text = (text or "").strip()
        lines = [
            ln.strip() for ln in text.splitlines() if ln.strip().startswith(("version", "built"))
        ]
        version = " ; ".join(lines) if lines else text[-300:]
        rc = proc.returncode
    return BinaryIdentity(path=str(server_bin), sha256=digest, version=version, version_rc=rc,
                          libraries=libraries)  # fmt: skip
