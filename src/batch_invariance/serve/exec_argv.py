"""What ``serve`` execs, once it knows the cert and has pinned the files: the served
argv with the model handed over as its descriptor and path options made absolute (serve
leaves the caller's folder), where a ``--log-file`` may not write, and the environment the
server gets. The argv itself is the gate's (:func:`batch_invariance.gate.served.served_argv`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from batch_invariance.cert.provenance import Provenance
from batch_invariance.engines.llama_server.env import ServedEnv, served_env
from batch_invariance.gate.serve_line import ServeRefused
from batch_invariance.gate.served import option_spans, recorded_engine_env


def served_environment(parent: Mapping[str, str], provenance: Provenance) -> ServedEnv:
    """The environment ``serve`` gives the server of ``provenance`` when started from
    ``parent``: the neutral and GPU-selection variables of ``parent`` plus exactly the engine
    variables the cert recorded (llama-server's rule,
    :func:`batch_invariance.engines.llama_server.env.served_env`), with what it refuses."""
    return served_env(parent, recorded_engine_env(provenance))


def descriptor_argv(argv: Sequence[str], model_fd_path: str) -> tuple[str, ...]:
    """The argv ``serve`` execs once the model is open: every ``--model`` value replaced by
    the descriptor path (llama-server opens that, the inode that was hashed), and, unless an
    alias is given, ``--alias`` with the measured model path, so the name the API reports
    (``/v1/models``, ``model_alias``) stays the measured server's (a path with a comma cannot
    be one alias: llama-server splits aliases on commas; it then reports the descriptor path).
    """
    out = [argv[0]]
    model: str | None = None
    aliased = False
    for index, spec, width in option_spans(argv):
        words = list(argv[index : index + width])
        if spec is not None and spec.canonical == "--model" and len(words) == 2:
            model = words[1]
            words[1] = model_fd_path
        aliased = aliased or (spec is not None and spec.canonical == "--alias")
        out.extend(words)
    if model is None:
        raise ServeRefused("the served argv names no --model: nothing to hand over")
    if not aliased and "," not in model:
        out.extend(("--alias", model))
    return tuple(out)


#: Neutral options whose value is a path the server opens by name: serve makes them absolute
#: before it leaves the caller's folder (it execs the server in ``/``).
READ_PATH_OPTIONS = frozenset(
    {"--api-key-file", "--ssl-key-file", "--ssl-cert-file", "--path", "--ui-config-file"}
)
#: Neutral options whose value is a file the server writes.
WRITE_PATH_OPTIONS = frozenset({"--log-file"})


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
