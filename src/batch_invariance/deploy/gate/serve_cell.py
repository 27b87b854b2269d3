"""``batch-invariance serve --certs DIR -- ENGINE ARGS...``: the cert that measured exactly the
engine command a deploy writes.

The deploy states its cell as the engine's own command line, so raising ``--parallel`` stays
a one-word change. On the serving host, at start, the command is read as check-deploy reads a
server it starts (:func:`~batch_invariance.deploy.gate.cells.cell_of`), with the environment
the server will get (neutral, GPU selection and engine variables; never ``LLAMA_ARG_*``, which
serve drops, and no user config folder), and held against every cert in DIR by the gate's own
rules (:func:`~batch_invariance.deploy.gate.check.check_cell`): model and binary by the sha256
read through the descriptors serve will hand over, llama.cpp's libraries beside the binary by
theirs, ctx per slot, N, KV layout (a unified pool
by its size), every option that is not neutral, the prompt cache, engine variables, answer
length and sequence scope. One way to decide "this cert measured this cell", here and in
check-deploy.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.cert.signature import BundlePolicy
from batch_invariance.deploy.gate.cells import DeployCell, cell_of
from batch_invariance.deploy.gate.certs import index_certs
from batch_invariance.deploy.gate.check import check_cell
from batch_invariance.deploy.gate.identity import BuildIdentity, ModelIdentity
from batch_invariance.deploy.gate.pinned_files import ServedFiles
from batch_invariance.deploy.gate.serve_plan import (
    ServeLine,
    engine_env_of,
    engine_words,
)
from batch_invariance.deploy.readers.commands import ServerCommand
from batch_invariance.engines.llama_server.options import NEUTRAL, OptionSpec, lookup
from batch_invariance.errors import CertInvalid, NotCovered, UsageError


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


#: Neutral options whose value is a path the server opens by name: serve makes them absolute
#: before it leaves the caller's folder (it execs the server in ``/``).
READ_PATH_OPTIONS = frozenset(
    {"--api-key-file", "--ssl-key-file", "--ssl-cert-file", "--path", "--ui-config-file"}
)
#: Neutral options whose value is a file the server writes.
WRITE_PATH_OPTIONS = frozenset({"--log-file"})


def option_spans(argv: Sequence[str]) -> Iterator[tuple[int, OptionSpec | None, int]]:
    """(index, the option llama-server reads there or ``None``, how many words it takes) of
    each option of an engine argv, ``argv[0]`` (the program) left out."""
    index = 1
    while index < len(argv):
        spec = lookup(argv[index])
        width = 1 + (spec.nvalues if spec is not None else 0)
        yield index, spec, width
        index += width


def neutral_words(argv: Sequence[str]) -> tuple[str, ...]:
    """The neutral options of an engine command (``--host``, ``--port``, ...), as written."""
    return tuple(
        word
        for index, spec, width in option_spans(argv)
        if spec is not None and spec.canonical in NEUTRAL
        for word in argv[index : index + width]
    )


def _path_values(argv: Sequence[str], wanted: frozenset[str]) -> list[tuple[int, str]]:
    """(index of the value, value) of every option of ``wanted`` in ``argv``."""
    return [
        (index + 1, argv[index + 1])
        for index, spec, width in option_spans(argv)
        if spec is not None and spec.canonical in wanted and width == 2 and index + 1 < len(argv)
    ]


def absolute_paths(argv: Sequence[str], cwd: Path) -> tuple[str, ...]:
    """``argv`` with every path-valued neutral option made absolute against ``cwd``."""
    out = list(argv)
    for at, value in _path_values(argv, READ_PATH_OPTIONS | WRITE_PATH_OPTIONS):
        if not value.startswith("/"):
            out[at] = str(cwd / value)
    return tuple(out)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


#: Folders of the system the server (and the loader, before it) reads from: a log written
#: there, by a server running as root, could be ``/etc/ld.so.preload`` or a library the next
#: start loads. Only the standard streams and the null device are taken under them.
SYSTEM_FOLDERS = ("/etc", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin",
                  "/boot", "/proc", "/sys", "/dev")  # fmt: skip
LOG_DEVICES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


def _inside(real: str, folder: str) -> bool:
    base = os.path.realpath(folder)
    return real == base or real.startswith(base.rstrip("/") + "/")


def write_problem(argv: Sequence[str], reads: Sequence[str], folders: Sequence[str]) -> str | None:
    """Why a file the server would write (``--log-file``) could change something it reads:
    the same file as one of ``reads`` (binary, model, cert, a read option's file), or a file
    inside one of ``folders`` (the binary's folder, where its libraries load from; a
    ``--path`` folder) or a system folder."""
    read_values = [value for _, value in _path_values(argv, READ_PATH_OPTIONS)]
    for _, target in _path_values(argv, WRITE_PATH_OPTIONS):
        real = os.path.realpath(target)
        if target not in LOG_DEVICES and any(_inside(real, f) for f in SYSTEM_FOLDERS):
            return (
                f"--log-file {target} is in a system folder, which the server and the loader "
                "read files from (/etc/ld.so.preload, libraries): log to a folder of its own"
            )
        for read in (*reads, *read_values):
            if _same_file(target, read):
                return f"--log-file {target} is {read}, which the server reads: log elsewhere"
        for folder in (*folders, *(v for v in read_values if os.path.isdir(v))):
            if _inside(real, folder):
                return (
                    f"--log-file {target} is inside {folder}, which the server reads files "
                    "from: log to a folder of its own"
                )
    return None
