"""Finding, reading and checking the certs of a report (the imperative shell).

A path may be a cert file or a folder. A folder is searched recursively for cert files, named
``{model}__ctx{C}__N{N}.json`` as ``write_cert`` names them; superseded copies
(``*.superseded-*.json``), sigstore bundles and other JSON files (``sweep.json``, work-sets)
are skipped. Each cert is checked end to end (schema, digest, verdict re-derived from its
evidence, identity) by :func:`~batch_invariance.cert.verify.verify`, bytes that already
passed under this code recalled from :mod:`~batch_invariance.cert.memo`; a cert that fails is
kept as a :class:`~batch_invariance.report.model.LoadedCert` with its one-line problem.

The bundle beside a cert (``CERT.sigstore.json``) is verified only against an identity
policy; without one the report says "bundle present, not verified".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from batch_invariance.cert.compare_view import side_from_cert
from batch_invariance.cert.memo import verified_memo
from batch_invariance.cert.schema import cert_to_json
from batch_invariance.cert.signature import BundlePolicy, SignerPolicy, TrustRoot
from batch_invariance.cert.signing import (
    bundle_path_for,
)
from batch_invariance.cert.verify import Depth, verify
from batch_invariance.errors import BatchInvarianceError, CertInvalid, UsageError
from batch_invariance.report.model import LoadedCert, Signature

__all__ = ["BundleCheck", "check_signature", "collect", "is_cert_name", "load_all", "load_cert"]

_CERT_NAME = re.compile(r".+__ctx\d+__N\d+\.json")


def is_cert_name(path: Path) -> bool:
    return bool(_CERT_NAME.fullmatch(path.name)) and ".superseded-" not in path.name


def collect(paths: Sequence[Path]) -> list[Path]:
    """Every cert file named by ``paths`` (files as given, folders searched), in order,
    without repeats. Raises UsageError for a path that does not exist or finds nothing."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*.json") if p.is_file() and is_cert_name(p))
            if not inside:
                raise UsageError(
                    f"{path}: no cert files ({{model}}__ctx{{C}}__N{{N}}.json) in this folder; "
                    "pass the folder the certs were written to"
                )
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"{path}: no such file or folder; pass cert files or folders")
    unique: dict[Path, None] = {}
    for path in found:
        unique.setdefault(path, None)
    return list(unique)


#: Checks that a bundle signs an artifact for a signer; raises CertInvalid if not (sigstore's
#: ``verify_bundle``; tests pass a fake).
BundleCheck = Callable[[Path, Path, SignerPolicy, TrustRoot], None]


def check_signature(
    cert: Path, policy: BundlePolicy | None, verify: BundleCheck | None = None
) -> Signature:
    bundle = bundle_path_for(cert)
    if not bundle.is_file():
        return Signature("unsigned", "no bundle")
    if policy is None:
        return Signature("present", f"{bundle.name}; pass --cert-identity to check it")
    if verify is None:
        # Imported here so that sigstore is only loaded when a signature is checked.
        from batch_invariance.cert.signature import verify_bundle

        verify = verify_bundle
    try:
        verify(cert, bundle, policy.signer, policy.trust)
    except CertInvalid as exc:
        return Signature("failed", str(exc))
    except BatchInvarianceError as exc:  # trust root unavailable: no answer either way
        return Signature("error", str(exc))
    return Signature("verified", f"{policy.signer.identity}, {policy.signer.issuer}")


def load_cert(path: Path, policy: BundlePolicy | None) -> LoadedCert:
    """Check one cert file; a failure becomes the cert's problem, never an exception."""
    origin = str(path)
    checked = verify(path, Depth.REMEMBERED, memo=verified_memo())
    if checked.problems or checked.cert is None:
        problem = checked.problems[0] if checked.problems else f"{origin}: not a cert"
        return LoadedCert(origin, None, problem, False, Signature("unsigned", "not checked"))
    data = cert_to_json(checked.cert)
    signature = check_signature(path, policy)
    side = side_from_cert(checked.cert, origin)
    return LoadedCert(origin, data, None, checked.promotable, signature, side)


def load_all(paths: Sequence[Path], policy: BundlePolicy | None) -> list[LoadedCert]:
    return [load_cert(path, policy) for path in collect(paths)]


#: The record a search writes beside its folders of certs (service/search.py).
SEARCH_FILE = "search.json"


def load_searches(paths: Sequence[Path]) -> tuple[tuple[dict[str, Any], str], ...]:
    """The ``search.json`` record of every folder given that holds one, with its path; an
    unreadable one is left out (its certs are still reported, each verified on its own)."""
    found: list[tuple[dict[str, Any], str]] = []
    for path in paths:
        record = path / SEARCH_FILE
        if not record.is_file():
            continue
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("rows"), list):
            found.append((data, str(record)))
    return tuple(found)
