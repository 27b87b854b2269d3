"""Cert texts this installation has already verified, so reading one again skips what cannot
have changed.

Verifying a cert (:mod:`~batch_invariance.cert.verify`) scans its JSON for a key held twice,
recomputes its digest and re-derives its verdict from every arm's evidence: about a second
for 1,000 prompts x 64 tokens (20 MB of JSON). Those three answers are a pure function of two
things, the cert's bytes and the code that judges them, so once a text has passed all three
its :func:`memo_key` is remembered: sha256 over :func:`rules_fingerprint` and the bytes.
Reading the same bytes under the same rules again still parses and schema-checks them, and
still checks the version, the structure and the identity against the provenance; only the
three answers already known are not recomputed.

* The rules' fingerprint covers every source file of this package (an edit to any rule, or
  an editable install that moved on without a version bump, is another fingerprint) and the
  versions of Python, pydantic, pydantic-core and numpy, which parse, dump and compare.
* Only passes are remembered: a text that fails is verified in full on every read.
* A memo that cannot be read or written is no memo: everything is verified in full.
* It is worth exactly what the digest is worth (accidents, not forgery): whoever can write
  an entry into the cache folder can as well write a cert whose evidence re-derives.
  Authenticity is the signature's job, and a signature is checked on every read.

Where: ``$BATCH_INVARIANCE_VERIFIED_MEMO`` (a folder, or ``off``), else
``<cache>/verified`` (:func:`~batch_invariance.cache_dir.cache_root`). Deleting the folder
forgets everything. ``verify-cert``, check-deploy and ``serve`` never read it: the gate in front
of a deploy verifies every cert in full on every read.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy
import pydantic
import pydantic_core

import batch_invariance
from batch_invariance.cache_dir import cache_root

__all__ = [
    "MEMO_ENV",
    "FolderMemo",
    "VerifiedMemo",
    "fingerprint_of",
    "memo_key",
    "rules_fingerprint",
    "verified_memo",
]

#: A folder for the memo, or ``off`` to verify every cert in full on every read.
MEMO_ENV = "BATCH_INVARIANCE_VERIFIED_MEMO"


class VerifiedMemo(Protocol):
    """Which cert texts (by :func:`memo_key`) have passed the full verification."""

    def knows(self, key: str) -> bool: ...

    def remember(self, key: str) -> None: ...


@dataclass(frozen=True)
class FolderMemo:
    """One empty file per remembered key: there is nothing to half-write."""

    folder: Path

    def knows(self, key: str) -> bool:
        try:
            return (self.folder / key).is_file()
        except OSError:
            return False

    def remember(self, key: str) -> None:
        # A memo is only ever a shortcut: one that cannot be written leaves full verification.
        with contextlib.suppress(OSError):
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / key).touch()


def verified_memo(env: Mapping[str, str] | None = None) -> VerifiedMemo | None:
    """The memo ``compare`` (with ``run-live --baseline`` and the Action's baseline) and
    ``report`` read through, or ``None``."""
    e = os.environ if env is None else env
    where = e.get(MEMO_ENV, "").strip()
    if where.lower() == "off":
        return None
    return FolderMemo(Path(where).expanduser() if where else cache_root(e) / "verified")


@functools.lru_cache(maxsize=1)
def rules_fingerprint() -> str | None:
    """sha256 over the code that judges a cert here, or ``None`` when a source file cannot be
    read (then nothing is remembered or recalled)."""
    versions = (sys.version, pydantic.VERSION, pydantic_core.__version__, numpy.__version__)
    return fingerprint_of(Path(batch_invariance.__file__).resolve().parent, versions)


def fingerprint_of(package: Path, versions: tuple[str, ...]) -> str | None:
    """sha256 over ``versions`` and every ``*.py`` under ``package`` (paths and bytes), or
    ``None`` when there is none or one cannot be read."""
    digest = hashlib.sha256()
    for part in versions:
        _update(digest, part.encode())
    try:
        files = sorted(package.rglob("*.py"), key=lambda f: f.relative_to(package).as_posix())
        for file in files:
            _update(digest, file.relative_to(package).as_posix().encode())
            _update(digest, file.read_bytes())
    except OSError:
        return None
    return digest.hexdigest() if files else None


def _update(digest: hashlib._Hash, part: bytes) -> None:
    # Length-prefixed, so no two sequences of parts hash alike.
    digest.update(len(part).to_bytes(8, "big"))
    digest.update(part)


def memo_key(text: str | bytes) -> str | None:
    """The key of ``text`` under this installation's rules, or ``None`` (no memo)."""
    rules = rules_fingerprint()
    if rules is None:
        return None
    try:
        data = text.encode("utf-8") if isinstance(text, str) else text
    except UnicodeEncodeError:  # a lone surrogate: no bytes to key, so no memo
        return None
    digest = hashlib.sha256()
    _update(digest, rules.encode())
    digest.update(data)
    return digest.hexdigest()
