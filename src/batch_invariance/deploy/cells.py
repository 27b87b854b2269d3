"""From a server a deploy starts to the cell it runs: model, ctx per slot, N and KV layout.

llama-server's own rules apply (see :mod:`batch_invariance.core.llama_flags`): no ``-np`` (or
``-np -1``) is 4 slots sharing one unified KV pool; ``-c 0`` or no ``-c`` is the model's
training context, read from the GGUF header when the file is here. A cell's ``ctx`` is the
context per slot (``-c / N``), which is what a cert's ``ctx`` means; for a unified pool the
pool itself (``-c``) must also equal the one measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from batch_invariance.core.llama_flags import (
    FlagError,
    ServerFlags,
    SlotLayout,
    read_flags,
    slot_layout,
)
from batch_invariance.deploy.config import ServerCommand
from batch_invariance.errors import UsageError


@dataclass(frozen=True)
class DeployCell:
    """One server the deploy config would start, as the cell it runs."""

    origin: str
    #: The model as written (a path, or an ``-hf`` repo).
    model: str
    #: Where that model file is on this machine (``None`` for ``-hf`` / ``-mu``).
    model_path: Path | None
    #: The models.toml alias, when the cell comes from one.
    alias: str | None
    flags: ServerFlags
    layout: SlotLayout
    #: ``-c`` as the server gets it (0 = the model's training context).
    ctx_size: int
    #: The whole KV pool in tokens; ``None`` when ``-c`` is 0 and the model file is not here.
    pool: int | None
    #: Environment files that could not be read (the cell fails closed).
    unread_env_files: tuple[str, ...] = ()
    #: The server binary as the deploy names it (``argv[0]``).
    binary: str = "llama-server"
    #: Where that binary is on this machine; ``None`` when it cannot be located here.
    binary_path: Path | None = None
    #: Why it cannot be located here (for the message); ``None`` when it was.
    binary_missing: str | None = None

    @property
    def parallel(self) -> int:
        return self.layout.parallel

    @property
    def ctx(self) -> int | None:
        """Context per slot (a cert's ``ctx``)."""
        return None if self.pool is None else self.pool // self.parallel

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


def _host_path(model: str, command: ServerCommand) -> Path:
    """The host path of a model path as written (compose mounts mapped back, relative paths
    against the deploy file's folder)."""
    for container, host in command.mounts:
        if model == container or model.startswith(container + "/"):
            model = host + model[len(container) :]
            break
    path = Path(model).expanduser()
    return path if path.is_absolute() else command.base_dir / path


def _binary_path(command: ServerCommand) -> tuple[Path | None, str | None]:
    """Where the server binary of ``command`` is on this machine, or why it is not here: a
    path as written (relative to the deploy file's folder), a bare name looked up on the
    deploy's ``PATH`` (its own, else this process's)."""
    import os
    import shutil

    word = command.argv[0] if command.argv else "llama-server"
    if command.binary_elsewhere is not None:
        return None, f"server binary {word} {command.binary_elsewhere}"
    if "/" not in word:
        search = command.env.get("PATH") or os.environ.get("PATH", "")
        found = shutil.which(word, path=search)
        if found is None:
            return None, f"server binary {word} is not on PATH here"
        return Path(found), None
    path = Path(word).expanduser()
    return (path if path.is_absolute() else command.base_dir / path), None


def _trained_ctx(path: Path | None) -> int | None:
    if path is None or not path.is_file():
        return None
    from batch_invariance.engines.gguf import parse_info

    try:
        return parse_info(path).context_length
    except (UsageError, OSError):
        return None


def cell_of(command: ServerCommand) -> DeployCell:
    """The cell one server runs; a value llama-server would refuse is a usage error."""
    try:
        flags = read_flags(command.argv, command.env)
        layout = slot_layout(flags)
        ctx_size = flags.ctx_size or 0
    except FlagError as exc:
        raise UsageError(f"{command.origin}: {exc}") from None
    if ctx_size < 0:
        raise UsageError(f"{command.origin}: invalid --ctx-size {ctx_size}")
    model = command.model_override or flags.model
    path: Path | None = None
    if model:
        path = _host_path(model, command)
    else:
        model = flags.hf_repo or flags.values.get("model_url")
        if not model:
            raise UsageError(
                f"{command.origin}: no model (-m/--model) in this llama-server command"
            )
    pool = ctx_size if ctx_size > 0 else _trained_ctx(path)
    binary_path, binary_missing = _binary_path(command)
    return DeployCell(
        origin=command.origin,
        model=model,
        model_path=path,
        alias=command.alias,
        flags=flags,
        layout=layout,
        ctx_size=ctx_size,
        pool=pool,
        unread_env_files=command.unread_env_files,
        binary=command.argv[0] if command.argv else "llama-server",
        binary_path=binary_path,
        binary_missing=binary_missing,
    )


def load_deploy_cells(path: Path, models_dir: str | None = None) -> tuple[DeployCell, ...]:
    """Read a deploy config and return the cell of every server it starts."""
    from batch_invariance.deploy.config import read_deploy_file

    return tuple(cell_of(command) for command in read_deploy_file(path, models_dir))
