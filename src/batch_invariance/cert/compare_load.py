"""Read the two sides of a comparison: certs or folders of certs, each verified first.

A comparison is only as good as its inputs, so every cert goes through the one verification
path (schema, digest, version, re-derived verdict, identity against its provenance) and,
unless signatures are waived, its ``CERT.sigstore.json`` must verify for the identity policy
check-deploy takes (identity, issuer, repository). Any cert that fails is a
:class:`~batch_invariance.errors.CertInvalid` (exit 5) and nothing is compared.

Cells pair by (model sha256, ctx, N): two engines may label one GGUF differently. Two single
files pair with each other whatever they hold (the comparison then says whether they are
comparable).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from batch_invariance.cert.compare_view import CertRef, Comparison, side_from_cert
from batch_invariance.cert.schema import Cert
from batch_invariance.cert.signature import BundlePolicy, SignerPolicy, TrustRoot, verify_bundle
from batch_invariance.cert.signing import bundle_path_for
from batch_invariance.cert.verify import verify_path
from batch_invariance.core.compare import compare_cells
from batch_invariance.errors import CertInvalid, UsageError

__all__ = ["BundleCheck", "LoadedCert", "compare_inputs", "load_side", "signature_words"]

#: Checks that a bundle signs an artifact for a signer; raises CertInvalid if not.
BundleCheck = Callable[[Path, Path, SignerPolicy, TrustRoot], None]

#: A file in a folder of certs that is no cert (sweep.json, a comparison) has none of these.
_CERT_KEY = "cert_version"


class LoadedCert:
    """One verified (and, when asked, signature-checked) cert and where it came from."""

    def __init__(self, path: Path, cert: Cert) -> None:
        self.path = path
        self.cert = cert

    @property
    def key(self) -> tuple[str, int, int]:
        mf = self.cert.provenance.model_file
        model = mf.sha256 if mf is not None and mf.sha256 else f"label:{self.cert.model}"
        return (model, self.cert.ctx, self.cert.dispatch_n)

    def ref(self) -> CertRef:
        return CertRef.of(self.cert, str(self.path))


def _cert_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UsageError(f"not found: {path}; give a cert file or a folder of certs")
    found: list[Path] = []
    for p in sorted(path.rglob("*.json")):
        if p.name.endswith(".sigstore.json") or ".superseded-" in p.name or not p.is_file():
            continue
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            found.append(p)  # unreadable: verification names why
            continue
        if isinstance(data, dict) and _CERT_KEY not in data:
            continue
        found.append(p)
    if not found:
        raise UsageError(f"no cert in {path}; give a cert file or a folder that holds certs")
    return found


def _check_signature(path: Path, policy: BundlePolicy, check: BundleCheck) -> None:
    bundle = bundle_path_for(path)
    if not bundle.is_file():
        raise CertInvalid(
            f"{path}: not signed (no {bundle.name} beside it); sign it, or pass "
            "--allow-unsigned for a local comparison"
        )
    check(path, bundle, policy.signer, policy.trust)


def load_side(
    path: Path, signing: BundlePolicy | None, check: BundleCheck = verify_bundle
) -> list[LoadedCert]:
    """Every cert of ``path``, each verified; raises CertInvalid on the first that is not."""
    loaded: list[LoadedCert] = []
    for file in _cert_files(path):
        verification = verify_path(file)
        verification.raise_if_invalid()
        assert verification.cert is not None
        if signing is not None:
            _check_signature(file, signing, check)
        loaded.append(LoadedCert(file, verification.cert))
    return loaded


def signature_words(signing: BundlePolicy | None) -> str:
    if signing is None:
        return "not checked (--allow-unsigned): the digest catches accidents, not forgery"
    repo = signing.signer.repository or "any repository"
    return f"verified for {signing.signer.identity} ({signing.signer.issuer}), signed for {repo}"


def _pairs(
    old: Sequence[LoadedCert], new: Sequence[LoadedCert]
) -> tuple[list[tuple[LoadedCert, LoadedCert]], list[LoadedCert], list[LoadedCert]]:
    if len(old) == 1 and len(new) == 1:
        return [(old[0], new[0])], [], []
    for side, certs in (("baseline", old), ("new", new)):
        seen: dict[tuple[str, int, int], Path] = {}
        for c in certs:
            if c.key in seen:
                raise UsageError(
                    f"the {side} holds two certs of one cell ({c.cert.model} ctx {c.cert.ctx} "
                    f"N {c.cert.dispatch_n}): {seen[c.key]} and {c.path}; give one of them"
                )
            seen[c.key] = c.path
    by_key = {c.key: c for c in new}
    pairs = [(c, by_key[c.key]) for c in old if c.key in by_key]
    old_keys = {c.key for c in old}
    return (
        pairs,
        [c for c in old if c.key not in by_key],
        [c for c in new if c.key not in old_keys],
    )


def compare_inputs(
    baseline: Path,
    new: Path,
    signing: BundlePolicy | None,
    check: BundleCheck = verify_bundle,
) -> Comparison:
    """Verify both sides, pair their cells and compare each pair."""
    old_certs = load_side(baseline, signing, check)
    new_certs = load_side(new, signing, check)
    pairs, only_old, only_new = _pairs(old_certs, new_certs)
    return Comparison(
        baseline=str(baseline),
        new=str(new),
        signatures=signature_words(signing),
        cells=tuple(
            (
                o.ref(),
                n.ref(),
                compare_cells(
                    side_from_cert(o.cert, str(o.path)), side_from_cert(n.cert, str(n.path))
                ),
            )
            for o, n in pairs
        ),
        baseline_only=tuple(c.ref() for c in only_old),
        new_only=tuple(c.ref() for c in only_new),
    )
