"""Which model file and which server build a deploy runs, against the ones a cert measured.

Model: the strongest check available is used, and the result says which: the file's sha256
when it can be read here; its size and file name when it can only be stat'ed (no read
permission); nothing when it is not here at all (or is an ``-hf``/``-mu`` download), and then
the cell is not covered: a file name alone cannot tell two vendors' ``model.gguf`` apart.

Build: the server binary is part of the cell (another build computes differently). Its
sha256 must equal the ``provenance.server_binary.sha256`` the cert measured; a binary that
cannot be read here (absent, unreadable, inside a container image, not named by the file)
cannot be checked, and the cell is not covered. ``--server-binary`` names the file when the
deploy file does not name a readable one. The build is also llama.cpp's own libraries the
binary loads from beside it (``libllama``, ``libggml*`` with ggml's run-time backends,
``libmtmd``: :func:`~batch_invariance.engines.llama_server.linked.own_libraries`): each must
have the sha256 ``provenance.server_binary.libraries`` recorded, none missing and none more
(:func:`library_differences`, ``serve``'s rule too); a cert that recorded none covers a binary
that loads none. A library that cannot be read here leaves the build unchecked.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from batch_invariance.cert.provenance import BinaryRecord, ModelFileRecord, Provenance
from batch_invariance.engines.base import BuildLibraries


@dataclass(frozen=True)
class ModelIdentity:
    method: Literal["sha256", "size and name", "nothing"]
    name: str
    sha256: str | None = None
    size: int | None = None
    #: Why nothing could be checked (for the message).
    missing: str | None = None


def identify_model(path: Path | None, written: str) -> ModelIdentity:
    """Hash the deploy's model file when readable; else stat it; else say why not."""
    from batch_invariance.host.facts import cached_sha256

    if path is None:
        return ModelIdentity("nothing", written, missing=f"{written} is downloaded, not a file")
    try:
        size = path.stat().st_size
    except OSError:
        return ModelIdentity("nothing", path.name, missing=f"model file {path} not found here")
    try:
        return ModelIdentity("sha256", path.name, sha256=cached_sha256(path, None), size=size)
    except OSError:
        return ModelIdentity("size and name", path.name, size=size)


def model_differences(model: ModelIdentity, provenance: Provenance) -> tuple[str, ...]:
    """Why the cert's model is not (provably) the deploy's (empty = the same file)."""
    recorded = provenance.model_file or ModelFileRecord()
    sha, size, name = recorded.sha256, recorded.size, recorded.name
    if model.method == "nothing":
        return (_model_gap(model),)
    if model.method == "sha256":
        if sha is None:
            return ("the cert records no model sha256",)
        if sha != model.sha256:
            return (f"model sha256 {str(model.sha256)[:12]}... (measured {sha[:12]}...)",)
        return ()
    if (size, name) != (model.size, model.name):
        return (f"model {model.name} of {model.size} bytes (measured {name} of {size} bytes)",)
    return ()


@dataclass(frozen=True)
class BuildIdentity:
    """The server build a deploy runs: its binary's sha256, or why it cannot be read here."""

    #: How the binary was found, for messages (``/usr/bin/llama-server``).
    shown: str
    sha256: str | None = None
    missing: str | None = None
    #: llama.cpp's libraries it loads, hashed here; ``None``: no ELF file, it loads none.
    libraries: BuildLibraries | None = None


def identify_build(
    path: Path | None, missing: str | None, override: Path | None, *, named: bool
) -> BuildIdentity:
    """Hash the deploy's server binary: the file the deploy names (``named``: a path, not a
    bare name found on ``PATH``), else ``override`` (``--server-binary``) when given, else
    what ``PATH`` found; ``missing`` says why none was located."""
    from batch_invariance.engines.llama_server.linked import own_libraries
    from batch_invariance.host.facts import cached_sha256

    if override is not None and not (named and missing is None):
        path, missing, how = override, None, f"{override} (--server-binary)"
    else:
        how = str(path)
    if path is None:
        return BuildIdentity(how, missing=missing or "the server binary is not here")
    try:
        sha256 = cached_sha256(path, None)
    except OSError as exc:
        why = "not found here" if isinstance(exc, FileNotFoundError) else "not readable here"
        return BuildIdentity(how, missing=f"server binary {path} {why}")
    libraries = own_libraries(path, lambda p: cached_sha256(p, None))
    return BuildIdentity(how, sha256=sha256, libraries=libraries)


def build_differences(build: BuildIdentity, provenance: Provenance) -> tuple[str, ...]:
    """Why the cert's server build is not (provably) the deploy's (empty = the same binary)."""
    recorded = provenance.server_binary
    sha = recorded.sha256 if recorded is not None else None
    if build.missing is not None:
        return (_build_gap(build),)
    if sha is None:
        return ("the cert records no server binary sha256 (build unknown)",)
    if sha != build.sha256:
        return (f"server build sha256 {str(build.sha256)[:12]}... (measured {sha[:12]}...)",)
    return library_differences(build.libraries, recorded)


def library_differences(
    found: BuildLibraries | None, recorded: BinaryRecord | None
) -> tuple[str, ...]:
    """Why llama.cpp's libraries the binary loads here (``found``, ``None``: no ELF file) are
    not (provably) the ones the cert measured with it (empty = the same files, by content)."""
    if found is None:
        return ()
    if found.unread is not None:
        return (_libraries_gap(found),)
    here = dict(found.sha256)
    measured = None if recorded is None else recorded.library_sha256()
    if measured is None:
        if not here:
            return ()
        return (
            f"the cert records no llama.cpp libraries and the server binary loads "
            f"{', '.join(here)} from beside it: re-measure the cell with this release, which "
            "records them",
        )
    listed = f"only {', '.join(measured)}" if measured else "none"
    out = []
    for name in sorted(here.keys() | measured.keys()):
        sha, was = here.get(name, ""), measured.get(name, "")
        if not was:
            out.append(
                f"llama.cpp library {name} (sha256 {sha[:12]}...) is beside the server binary "
                f"but the cert measured {listed}: remove it, or measure this build"
            )
        elif not sha:
            out.append(
                f"llama.cpp library {name} the cert measured (sha256 {was[:12]}...) is not "
                "beside the server binary: restore the measured build, or measure this one"
            )
        elif sha != was:
            out.append(
                f"llama.cpp library {name} has sha256 {sha[:12]}... (measured {was[:12]}...): "
                "restore the measured library, or measure this build"
            )
    return tuple(out)


def _model_gap(model: ModelIdentity) -> str:
    return f"{model.missing}: its identity (sha256, or size and name) cannot be checked"


def _build_gap(build: BuildIdentity) -> str:
    return (
        f"{build.missing}: its build (sha256) cannot be checked; give its path in the "
        "deploy file or --server-binary"
    )


def _libraries_gap(found: BuildLibraries) -> str:
    return f"{found.unread}: the build's llama.cpp libraries cannot be checked"


def identity_gaps(model: ModelIdentity, build: BuildIdentity) -> tuple[str, ...]:
    """What of the deploy's identity cannot be checked on this machine, in the words the
    differences use (empty = the model and the build can both be checked): a cert whose only
    differences are these may have measured the cell, which no one can tell here."""
    gaps: tuple[str, ...] = () if model.method != "nothing" else (_model_gap(model),)
    libraries = build.libraries
    if libraries is not None and libraries.unread is not None:
        gaps += (_libraries_gap(libraries),)
    return gaps + (() if build.missing is None else (_build_gap(build),))


def own_launchers() -> tuple[Path, ...]:
    """The files that start this tool: the ``batch-invariance`` script beside the running
    interpreter (where pip puts it) and the script this process was started as."""
    found = [Path(sys.executable).with_name("batch-invariance")]
    started = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if started is not None and started.name == "batch-invariance":
        found.append(started)
    return tuple(p for p in found if p.is_file())


def is_this_tool(path: Path, launchers: tuple[Path, ...] | None = None) -> bool:
    """``path`` has the bytes of this tool's launcher: the same script, whose first line names
    the same interpreter, which imports this same package. Checked by content, as the server
    binary is: a file named ``batch-invariance`` proves nothing."""
    from batch_invariance.host.facts import cached_sha256

    try:
        wanted = cached_sha256(path, None)
    except OSError:
        return False
    for launcher in launchers if launchers is not None else own_launchers():
        try:
            if cached_sha256(launcher, None) == wanted:
                return True
        except OSError:
            continue
    return False
