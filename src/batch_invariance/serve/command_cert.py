"""``batch-invariance serve --certs DIR -- ENGINE ARGS...``: the cert that measured exactly the
engine command a deploy writes.

The deploy states its cell as the engine's own command line, so raising ``--parallel`` stays
a one-word change. On the serving host, at start, the command is read as check-deploy reads a
server it starts (:func:`~batch_invariance.gate.cells.cell_of`), with the environment
the server will get (neutral, GPU selection and engine variables; never ``LLAMA_ARG_*``, which
serve drops, and no user config folder), and held against every cert in DIR by the gate's own
rules (:func:`~batch_invariance.gate.check.check_cell`): model and binary by the sha256
read through the descriptors serve will hand over, llama.cpp's libraries beside the binary by
theirs, ctx per slot, N, KV layout (a unified pool
by its size), every option that is not neutral, the prompt cache, engine variables, answer
length and sequence scope. One way to decide "this cert measured this cell", here and in
check-deploy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.cert.signature import BundlePolicy
from batch_invariance.engines.llama_server.options import NEUTRAL
from batch_invariance.errors import CertInvalid, NotCovered, UsageError
from batch_invariance.gate.cells import DeployCell, cell_of
from batch_invariance.gate.certs import index_certs
from batch_invariance.gate.check import check_cell
from batch_invariance.gate.identity import BuildIdentity, ModelIdentity
from batch_invariance.gate.serve_line import ServeLine
from batch_invariance.gate.served import engine_env_of, engine_words, option_spans
from batch_invariance.gate.server_command import ServerCommand
from batch_invariance.serve.pinned_files import ServedFiles


def engine_command(
    words: Sequence[str], environ: Mapping[str, str], cwd: Path, origin: str = "serve"
) -> ServerCommand:
    """The engine command after serve's ``--``, in the environment serve gives the server."""
    line = ServeLine(None, tuple(words), cwd)
    return ServerCommand(
        origin=origin, argv=engine_words(line, origin), env=engine_env_of(environ),
        base_dir=cwd, search_path=environ.get("PATH", os.defpath),
    )  # fmt: skip


def command_cell(command: ServerCommand) -> DeployCell:
    """The cell the command runs, with the files serve must pin, or why it cannot be served."""
    cell = cell_of(command)
    if not cell.needs_cert:
        raise UsageError(
            f"{cell.label}: N=1 co-batches nothing, so no cert measures it; start the engine "
            "directly, or give --parallel the N a cert measured"
        )
    if cell.binary_path is None:
        raise UsageError(f"{cell.binary_missing or 'the server binary is not here'}")
    if cell.model_path is None:
        raise UsageError(
            cell.not_covered[-1]
            if cell.not_covered
            else f"model {cell.model} is not a file "
            "here (serve pins a local model file; -hf and -mu download one it cannot check)"
        )
    return cell


@dataclass(frozen=True)
class CommandCert:
    """The cert that measured the command's cell, and the command's neutral options."""

    cert: Path
    neutral: tuple[str, ...]


def find_cert(
    cell: DeployCell,
    certs_dir: Path,
    files: ServedFiles,
    signing: BundlePolicy | None,
    argv: Sequence[str],
) -> CommandCert:
    """The promotable (and, per ``signing``, signed) cert in ``certs_dir`` that measured this
    cell with exactly these bytes (``files``, pinned); refuses, naming why, otherwise."""
    size = os.fstat(files.model.fd).st_size
    model = ModelIdentity("sha256", Path(files.model.path).name, files.model.sha256, size)
    build = BuildIdentity(files.binary.path, files.binary.sha256, libraries=files.libraries)
    check = check_cell(cell, index_certs(certs_dir), model, build, signing)
    if check.kind == "invalid":
        raise CertInvalid(f"serve {cell.label}: {check.reason}")
    if not check.ok or check.cert is None:
        raise NotCovered(f"no cert in {certs_dir} lets serve start {cell.label}: {check.reason}")
    return CommandCert(check.cert, neutral_words(argv))


def neutral_words(argv: Sequence[str]) -> tuple[str, ...]:
    """The neutral options of an engine command (``--host``, ``--port``, ...), as written."""
    return tuple(
        word
        for index, spec, width in option_spans(argv)
        if spec is not None and spec.canonical in NEUTRAL
        for word in argv[index : index + width]
    )
