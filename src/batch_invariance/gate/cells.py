"""From a server a deploy starts to the cell it runs: model, ctx per slot, N and KV layout,
by llama-server's own rules (:mod:`batch_invariance.engines.llama_server.flags`): no ``-np`` is
4 slots sharing one unified pool, ``-c 0`` or none is the model's training context (read from
the GGUF here), ``-c`` is padded as llama.cpp pads it. A cell also carries why it cannot be
covered whatever the certs say, the variables ggml and the runtimes its build links read, and
the GPUs it selects here. A ``batch-invariance serve`` line is read as the server it execs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from batch_invariance.core.gpu_placement import GpuPlacement, is_gpu_selection
from batch_invariance.engines.llama_server.env import (
    engine_env,
    is_engine_variable,
    is_neutral_variable,
    is_option_variable,
)
from batch_invariance.engines.llama_server.flags import (
    FlagError,
    ServerFlags,
    SlotLayout,
    padded_context,
    read_flags,
    slot_layout,
)
from batch_invariance.engines.llama_server.linked import linked_runtimes
from batch_invariance.engines.llama_server.options import TABLE_BUILD
from batch_invariance.engines.variables import Linked
from batch_invariance.errors import UsageError
from batch_invariance.gate.file_layout import layout_problem
from batch_invariance.gate.identity import is_this_tool
from batch_invariance.gate.serve_line import is_serve
from batch_invariance.gate.served import served_command
from batch_invariance.gate.server_command import ServerCommand
from batch_invariance.host.gpus import placement_here


@dataclass(frozen=True)
class DeployCell:
    """One server the deploy config would start, as the cell it runs."""

    origin: str
    #: The model as written (a path, or an ``-hf`` repo).
    model: str
    #: Where that model file is on this machine (``None`` for ``-hf`` / ``-mu``).
    model_path: Path | None
    flags: ServerFlags
    layout: SlotLayout
    #: The whole KV pool in tokens after llama.cpp's padding; ``None`` when ``-c`` is 0 (the
    #: model's training context) and the model file is not here.
    pool: int | None
    #: The context per slot after padding (a cert's ``ctx``).
    ctx: int | None = None
    #: Why this cell cannot be covered whatever the certs say (empty: it can be).
    not_covered: tuple[str, ...] = ()
    #: The variables of its environment that ggml / the runtimes its build links read
    #: (compared).
    engine_env: Mapping[str, str] = field(default_factory=dict)
    #: The runtimes its build links, read from the binary here (only their variables are
    #: compared); ``None`` where the binary is not here or cannot be read: every runtime's.
    linked: Linked = None
    #: The server binary as the deploy names it (``argv[0]``).
    binary: str = "llama-server"
    #: Where that binary is on this machine; ``None`` when it cannot be located here.
    binary_path: Path | None = None
    #: Why it cannot be located here (for the message); ``None`` when it was.
    binary_missing: str | None = None
    #: Said on its pass line (an optional environment file absent here).
    notes: tuple[str, ...] = ()
    #: The GPUs its environment selects on this host (compared with a cert's ``gpus``).
    gpus: GpuPlacement = field(default_factory=GpuPlacement)
    #: Why others could replace the serve program after the check: the deploy is not
    #: understood.
    untrusted: tuple[str, ...] = ()
    #: The engine command it runs (a serve line's: the one serve execs).
    argv: tuple[str, ...] = ()
    #: The options of the ``batch-invariance serve`` line that starts it; ``None``: the deploy
    #: starts the engine directly (never a pass:
    #: :mod:`batch_invariance.deploy.serve_required`).
    serve_options: tuple[tuple[str, str], ...] | None = None
    #: The container image it runs in (``None``: on the host).
    image: str | None = None

    @property
    def parallel(self) -> int:
        return self.layout.parallel

    @property
    def layout_name(self) -> str:
        return "unified" if self.layout.kv_unified else "split"

    @property
    def name(self) -> str:
        base = self.model.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
        return base[: -len(".gguf")] if base.lower().endswith(".gguf") else base

    @property
    def label(self) -> str:
        ctx = "?" if self.ctx is None else str(self.ctx)
        return f"{self.name} ctx={ctx} N={self.parallel} kv={self.layout_name}"

    @property
    def needs_cert(self) -> bool:
        return self.parallel > 1


class Located(NamedTuple):
    """A file of the deploy on this host, or why it is not here."""

    path: Path | None
    missing: str | None


def _host_path(model: str, command: ServerCommand) -> Located:
    """The host path of a model path as written, or why it is not on this host (a container
    path outside every bind mount, a relative path after a ``cd`` the reader lost)."""
    for container, host in command.mounts:  # longest container path first
        if model == container or model.startswith(container.rstrip("/") + "/"):
            return _as_written(host + model[len(container) :], "model", command)
    if command.image is not None:
        return Located(None, f"model {model} is inside the container (under no bind mount)")
    return _as_written(model, "model", command)


def _binary_path(command: ServerCommand) -> Located:
    """Where the server binary of ``command`` is on this machine, or why it is not here: a
    path as written (relative to the deploy file's folder), a bare name looked up on the
    deploy's ``PATH`` (its own, else this process's)."""
    word = command.argv[0] if command.argv else "llama-server"
    if command.binary_elsewhere is not None:
        return Located(None, f"server binary {word} {command.binary_elsewhere}")
    if "/" not in word:
        if command.search_path is None:
            return Located(None, f"program {word} is a bare name and the file sets no PATH (the "
                           "caller's PATH decides)")  # fmt: skip
        found = shutil.which(word, path=command.search_path)
        if found is None:
            return Located(None, f"program {word} is not on the file's PATH here")
        return Located(Path(found), None)
    return _as_written(word, "program", command)


def _as_written(word: str, what: str, command: ServerCommand) -> Located:
    """A path as the deploy writes it: absolute, or relative to the folder the command runs
    in; ``None`` and why when that folder is one the reader could not follow."""
    path = Path(word)  # a ~ the server gets is a folder named ~ (no program expands it)
    if path.is_absolute():
        return Located(path, None)
    if command.base_dir is None:
        return Located(None, f"{what} {word} is relative to a folder the reader could not follow")
    return Located(command.base_dir / path, None)


def _trained_ctx(path: Path | None) -> int | None:
    if path is None or not path.is_file():
        return None
    from batch_invariance.host.gguf import parse_info

    try:
        return parse_info(path).context_length
    except (UsageError, OSError):
        return None


def _not_covered(command: ServerCommand, flags: ServerFlags) -> list[str]:
    """Why a server's cell cannot be covered whatever the certs say."""
    out: list[str] = []
    other = sorted(
        name for name in command.env
        if not (is_neutral_variable(name) or is_option_variable(name) or is_engine_variable(name)
                or is_gpu_selection(name))
        and name != "XDG_CONFIG_HOME"
    )  # fmt: skip
    if other:
        out.append(
            f"environment {', '.join(other)}: a measured server runs without it (only neutral "
            "variables, LLAMA_ARG_*, GPU selection and the ones the engine reads are passed); "
            "do not export it"
        )
    for word in flags.rejected:
        hint = (
            f" (write {word.replace('=', ' ', 1)})" if word.startswith("-") and "=" in word else ""
        )
        out.append(f"llama-server rejects {word}: no such option in build {TABLE_BUILD}{hint}")
    for option in flags.unclassified():
        out.append(f"option {option} is in no class (neutral, compared, owned): not covered")
    return out


def _launcher_problem(command: ServerCommand, path: Path) -> str | None:
    """Why others could put another program where the serve line finds its launcher after the
    check: its file or a folder above it writable by someone else, or, for a bare name, a
    ``PATH`` folder searched before it that others could write into (sticky or not: a new
    file there runs instead); ``None`` when no one but you and root can."""
    word = command.argv[0]
    for folder in [] if "/" in word else (command.search_path or "").split(":"):
        if not folder.startswith("/"):
            return f"PATH entry {folder!r} is relative: the folder it names depends on the caller"
        if Path(folder, word) == path:
            break
        here = Path(folder)
        while not here.exists():  # whoever can create it can put a program in it
            here = here.parent
        st = here.stat()
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            return (
                f"PATH folder {folder} is searched before {path.parent} and others can write "
                f"{here}: a {word} put there later would run instead of serve"
            )
    real = os.path.realpath(path)
    return layout_problem("serve program", real, os.stat(real), folders=True)


def cell_of(command: ServerCommand) -> DeployCell:
    """The cell one server runs; a value llama-server would refuse is a usage error."""
    refused: list[str] = []
    untrusted: list[str] = []
    serve_options: tuple[tuple[str, str], ...] | None = None
    serving = is_serve(command.argv)
    if serving and command.image is None:  # serve pins the binary and model (pinned_files.py)
        program = _binary_path(command)
        if program.path is None or not is_this_tool(program.path):
            why = program.missing or f"{program.path} is not this tool (its bytes differ)"
            refused.append(f"serve line: {why}; write the path of this tool's launcher")
        elif (problem := _launcher_problem(command, program.path)) is not None:
            untrusted.append(problem)
    if serving:  # in a container, the image's digest names the serve program (serve_required)
        served = served_command(command)
        command, refused = served.command, [*refused, *served.problems]
        serve_options = served.line.options
    try:
        flags = read_flags(command.argv, command.env, first_is_binary=True)
        layout = slot_layout(flags)
        ctx_size = flags.ctx_size or 0
    except FlagError as exc:
        raise UsageError(f"{command.origin}: {exc}") from None
    if ctx_size < 0:
        raise UsageError(f"{command.origin}: invalid --ctx-size {ctx_size}")
    not_covered = [*refused, *_not_covered(command, flags)]
    model = flags.model
    path: Path | None = None
    if model:
        located = _host_path(model, command)
        path = located.path
        if located.missing:
            not_covered.append(located.missing)
    else:
        model = flags.hf_repo or flags.model_url
        if not model:
            raise UsageError(
                f"{command.origin}: no model (-m/--model) in this llama-server command"
            )
    n_ctx = ctx_size if ctx_size > 0 else _trained_ctx(path)
    padded = None if n_ctx is None else padded_context(n_ctx, layout)
    binary = _binary_path(command)
    linked = None if binary.path is None else linked_runtimes(binary.path)
    return DeployCell(
        origin=command.origin,
        model=model,
        model_path=path,
        flags=flags,
        layout=layout,
        pool=None if padded is None else padded.pool,
        ctx=None if padded is None else padded.per_slot,
        not_covered=tuple(not_covered),
        engine_env=engine_env(command.env, linked),
        linked=linked,
        binary=command.argv[0] if command.argv else "llama-server",
        binary_path=binary.path,
        binary_missing=binary.missing,
        notes=command.notes,
        gpus=placement_here(command.env),
        untrusted=tuple(untrusted),
        argv=tuple(command.argv),
        serve_options=serve_options,
        image=command.image,
    )
