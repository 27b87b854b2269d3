"""The cert store: certs measured by earlier gate runs (the ``batch-invariance-certs`` branch,
docs/action.md), read by later ones with no hand copying.

Nothing in a store is trusted for being there. A store cert joins the certs a deploy is held
against only when it verifies (schema, digest, re-derived verdict, the rules of this release)
and its sigstore bundle verifies for the gate's own signing policy (identity, issuer, source
repository). Any other file is ignored with one line naming it and why: it never covers a
cell, and never fails one either (a stranger's file in the store cannot block a deploy).
Under ``--allow-unsigned`` the signature is not checked, as for every cert of that gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from batch_invariance.cert.signature import BundlePolicy, verify_bundle
from batch_invariance.errors import UsageError
from batch_invariance.gate.certs import CertFile, index_certs
from batch_invariance.gate.check import BundleVerifier, signature_problem

__all__ = ["StoreRead", "read_store"]


@dataclass(frozen=True)
class StoreRead:
    #: The certs that verify and are signed per the gate's policy.
    admitted: tuple[CertFile, ...]
    #: One line per file ignored: its path and why.
    ignored: tuple[str, ...]


def _refusal(cert: CertFile, signing: BundlePolicy | None, verify: BundleVerifier) -> str | None:
    if cert.problem is not None:
        return cert.problem
    if signing is None:
        return None
    bad = signature_problem(cert, signing, verify)
    return None if bad is None else bad.reason


def read_store(
    folder: Path, signing: BundlePolicy | None, verify: BundleVerifier = verify_bundle
) -> StoreRead:
    """The store certs a gate may count (``signing=None``: ``--allow-unsigned``)."""
    if not folder.is_dir():
        raise UsageError(f"--store {folder}: no such folder (an empty store is an empty folder)")
    index = index_certs(folder)
    admitted: list[CertFile] = []
    ignored = [f"{folder}: {name}" for name in index.unreadable]
    for cert in index.certs:
        why = _refusal(cert, signing, verify)
        if why is None:
            admitted.append(cert)
        else:
            ignored.append(f"{cert.path}: {' '.join(why.split())[:300]}")
    return StoreRead(tuple(admitted), tuple(ignored))
