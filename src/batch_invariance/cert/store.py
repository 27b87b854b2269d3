"""Writing and reading cert files (the imperative shell around :mod:`certificate`).

* Certs are canonical JSON: sorted keys, two-space indent, UTF-8, trailing newline.
* :func:`write_cert` is atomic: the bytes go to a temporary file in the target folder, are
  fsynced, and ``os.replace`` puts them in place; a reader sees the old cert or the new one,
  never a partial file. A cert already at the target is first moved aside to a name suffixed
  with the NEW cert's timestamp and reported in :attr:`WrittenCert.superseded`: nothing is
  silently overwritten.
* :func:`read_cert_text` reads a cert file once for the verification path
  (:mod:`~batch_invariance.cert.verify`), raising
  :class:`~batch_invariance.errors.CertInvalid` with a one-line message.

``python -m batch_invariance.commands.write_schema --write-schema docs/cert.schema.json``
regenerates the published JSON schema from the pydantic model.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.cert.schema import Cert, cert_to_json, schema_text
from batch_invariance.errors import CertInvalid, InfraError

__all__ = [
    "WrittenCert",
    "atomic_write_text",
    "cert_path",
    "read_cert_text",
    "render",
    "write_cert",
    "write_schema",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_FILE_MODE = 0o644


@dataclass(frozen=True)
class WrittenCert:
    """Where a cert went, and where the cert it replaced was moved (if any)."""

    path: Path
    superseded: Path | None


def _safe(text: str) -> str:
    cleaned = _UNSAFE.sub("_", text).strip("._")
    return cleaned or "model"


def cert_path(out_dir: Path, model: str, ctx: int, n: int) -> Path:
    """``{out_dir}/{model}__ctx{C}__N{N}.json`` (characters unsafe in a file name become
    ``_``)."""
    return Path(out_dir) / f"{_safe(model)}__ctx{int(ctx)}__N{int(n)}.json"


def render(cert: Cert) -> str:
    """The canonical text of a cert file."""
    return (
        json.dumps(
            cert_to_json(cert),
            sort_keys=True,
            indent=2,
            ensure_ascii=False,
            allow_nan=False,
        )
        + "\n"
    )


def _fsync_dir(folder: Path) -> None:
    # Make the rename itself durable; not every platform lets a folder be opened.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _stage(target: Path, text: str) -> Path:
    """``text`` in a fsynced temporary file next to ``target`` (removed again on failure)."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp creates 0600; a cert is meant to be read by others (CI, reviewers).
        os.chmod(tmp, _FILE_MODE)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same folder, fsync, replace)."""
    tmp = _stage(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def _aside_name(target: Path, ts_utc: str) -> Path:
    stamp = re.sub(r"[^0-9A-Za-z]+", "", ts_utc) or "unknown"
    base = target.with_name(f"{target.stem}.superseded-{stamp}{target.suffix}")
    candidate = base
    k = 1
    while candidate.exists():
        candidate = target.with_name(f"{target.stem}.superseded-{stamp}-{k}{target.suffix}")
        k += 1
    return candidate


def write_cert(out_dir: Path, cert: Cert) -> WrittenCert:
    """Write ``cert`` to :func:`cert_path` in ``out_dir`` atomically.

    A file already at the target is renamed to ``<name>.superseded-<ts>.json`` (``ts`` from
    the new cert's ``ts_utc``) before the new cert takes its place.
    """
    out = Path(out_dir)
    target = cert_path(out, cert.model, cert.ctx, cert.dispatch_n)
    text = render(cert)
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = _stage(target, text)
    except OSError as exc:
        raise InfraError(_write_failure(target, exc)) from None
    superseded: Path | None = None
    try:
        if target.exists():
            superseded = _aside_name(target, cert.ts_utc)
            os.replace(target, superseded)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if superseded is not None and not target.exists():
            # Put the old cert back rather than leave the cell without one.
            with contextlib.suppress(OSError):
                os.replace(superseded, target)
        fault = sys.exc_info()[1]
        if isinstance(fault, OSError):
            raise InfraError(_write_failure(target, fault)) from None
        raise
    _fsync_dir(target.parent)
    return WrittenCert(path=target, superseded=superseded)


def _write_failure(target: Path, exc: OSError) -> str:
    """One line for a cert that could not be written (disk full, permissions, ...)."""
    why = exc.strerror or f"{type(exc).__name__}: {exc}"
    return (
        f"cannot write cert {target} ({why}); no cert was written and any previous cert "
        "is unchanged; free space or fix permissions on --out-dir and rerun"
    )


def read_cert_text(path: Path) -> str:
    """The text of the cert file at ``path``; raises :class:`CertInvalid` when unreadable."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CertInvalid(f"{p}: no such cert file; check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CertInvalid(f"{p}: cannot read cert ({exc.__class__.__name__}: {exc})") from None


def write_schema(path: Path) -> None:
    """Write the cert JSON schema to ``path`` atomically."""
    atomic_write_text(Path(path), schema_text())
