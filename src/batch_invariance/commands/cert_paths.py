"""The cert paths a command line names, checked before anything reads them.

A path that is not there, or a folder where one cert file is expected (or a file where the
certs folder is), is a usage error (exit 2) whose one line says what to pass instead: it is
the command line that is wrong, not a cert (exit 5 is for a cert that is there and invalid).
"""

from __future__ import annotations

from pathlib import Path

from batch_invariance.errors import UsageError
from batch_invariance.report.load import is_cert_name

#: How a cert file is named (``cert.store`` writes it so).
CERT_NAME = "{model}__ctx{C}__N{N}.json"


def _named(flag: str, path: Path) -> str:
    return f"{flag} {path}" if flag else str(path)


def cert_file(path: Path, flag: str = "") -> Path:
    """``path`` when it is a file; ``flag`` names the option it came from (empty: the
    positional argument)."""
    if path.is_file():
        return path
    named = _named(flag, path)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.json") if is_cert_name(p))
        example = f", for example {path / found[0]}" if found else f" ({CERT_NAME})"
        raise UsageError(f"{named} is a folder; pass one cert file in it{example}")
    if path.exists():
        raise UsageError(f"{named} is not a regular file; pass a cert file ({CERT_NAME})")
    raise UsageError(
        f"{named}: no such file; check the path, or write the cert first (run-live --out-dir)"
    )


def certs_folder(path: Path, flag: str) -> Path:
    """``path`` when it is a folder (of certs, searched recursively)."""
    if path.is_dir():
        return path
    if path.exists():
        raise UsageError(
            f"{flag} {path} is a file; pass the folder that holds the certs (it is searched "
            "recursively), not one cert"
        )
    raise UsageError(
        f"{flag} {path}: no such folder; pass the folder the certs were written to "
        "(run-live --out-dir)"
    )
