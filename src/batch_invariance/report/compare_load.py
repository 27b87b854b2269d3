"""Read the two sides of a comparison: certs or folders of certs, each verified first.

A comparison is only as good as its inputs, so every cert goes through the one verification
path (schema, digest, version, re-derived verdict, identity against its provenance; bytes
that already passed under this code are not re-derived again, :mod:`~batch_invariance.cert.memo`),
except a baseline written under other decision rules: that one is read through its schema and
digest only, and the comparison says its verdict was not re-derived
(:mod:`~batch_invariance.cert.baseline`). And,
unless signatures are waived, its ``CERT.sigstore.json`` must verify for the identity policy
check-deploy takes (identity, issuer, repository). Any cert that fails is a
:class:`~batch_invariance.errors.CertInvalid` (exit 5) and nothing is compared.

Cells pair by (model sha256, ctx, N): two engines may label one GGUF differently. Two single
files pair with each other whatever they hold (the comparison then says whether they are
comparable).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from batch_invariance.cert.baseline import read_baseline_path
from batch_invariance.cert.compare_view import CertRef, Comparison, side_from_cert
from batch_invariance.cert.memo import VerifiedMemo, verified_memo
from batch_invariance.cert.schema import Cert
from batch_invariance.cert.signature import BundlePolicy
from batch_invariance.cert.verify import Depth, verify
from batch_invariance.core.compare import CellComparison, compare_cells
from batch_invariance.errors import CertInvalid, InfraError, UsageError
from batch_invariance.report.load import BundleCheck, check_signature, collect

__all__ = [
    "LoadedSide",
    "compare_inputs",
    "compare_loaded",
    "compare_with_run",
    "comparison_path",
    "load_side",
    "signature_words",
]


class LoadedSide:
    """One verified (and, when asked, signature-checked) cert and where it came from;
    ``rules_note``: a baseline of other rules, read without re-deriving its verdict."""

    def __init__(self, path: Path, cert: Cert, rules_note: str | None = None) -> None:
        self.path = path
        self.cert = cert
        self.rules_note = rules_note

    @property
    def key(self) -> tuple[str, int, int]:
        mf = self.cert.provenance.model_file
        model = mf.sha256 if mf is not None and mf.sha256 else f"label:{self.cert.model}"
        return (model, self.cert.ctx, self.cert.dispatch_n)

    def ref(self) -> CertRef:
        return CertRef.of(self.cert, str(self.path), self.rules_note)


def _require_signature(path: Path, policy: BundlePolicy, check: BundleCheck | None) -> None:
    signature = check_signature(path, policy, check)
    if signature.state == "verified":
        return
    if signature.state == "unsigned":
        raise CertInvalid(
            f"{path}: not signed (no {path.name}.sigstore.json beside it); sign it, or pass "
            "--allow-unsigned for a local comparison"
        )
    if signature.state == "error":
        raise InfraError(signature.detail)
    raise CertInvalid(signature.detail)


def _read(file: Path, memo: VerifiedMemo | None, baseline: bool) -> LoadedSide:
    if baseline:
        found = read_baseline_path(file, memo)
        return LoadedSide(file, found.cert, found.rules_note)
    verification = verify(file, Depth.REMEMBERED, memo=memo)
    verification.raise_if_invalid()
    assert verification.cert is not None
    return LoadedSide(file, verification.cert)


def load_side(
    path: Path,
    signing: BundlePolicy | None,
    check: BundleCheck | None = None,
    *,
    baseline: bool = False,
) -> list[LoadedSide]:
    """Every cert of ``path``, each verified; raises CertInvalid on the first that is not.

    ``baseline``: a cert written under other decision rules (an earlier release's) is read
    as far as its fields allow (schema, digest), its verdict not re-derived, and says so
    (:mod:`~batch_invariance.cert.baseline`); under these rules it is verified in full."""
    if not path.exists():
        raise UsageError(f"not found: {path}; give a cert file or a folder of certs")
    loaded: list[LoadedSide] = []
    memo = verified_memo()
    for file in collect([path]):
        side = _read(file, memo, baseline)
        if signing is not None:
            _require_signature(file, signing, check)
        loaded.append(side)
    return loaded


def signature_words(signing: BundlePolicy | None) -> str:
    if signing is None:
        return "not checked (--allow-unsigned): the digest catches accidents, not forgery"
    repo = signing.signer.repository or "any repository"
    return f"verified for {signing.signer.identity} ({signing.signer.issuer}), signed for {repo}"


def _pairs(
    old: Sequence[LoadedSide], new: Sequence[LoadedSide]
) -> tuple[list[tuple[LoadedSide, LoadedSide]], list[LoadedSide], list[LoadedSide]]:
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


def _compare(old: LoadedSide, new: LoadedSide) -> CellComparison:
    return compare_cells(
        side_from_cert(old.cert, str(old.path)), side_from_cert(new.cert, str(new.path))
    )


def compare_loaded(
    old_certs: Sequence[LoadedSide],
    new_certs: Sequence[LoadedSide],
    baseline: str,
    new: str,
    signatures: str,
) -> Comparison:
    """Pair the cells of two verified sides and compare each pair."""
    pairs, only_old, only_new = _pairs(old_certs, new_certs)
    return Comparison(
        baseline=baseline,
        new=new,
        signatures=signatures,
        cells=tuple((o.ref(), n.ref(), _compare(o, n)) for o, n in pairs),
        baseline_only=tuple(c.ref() for c in only_old),
        new_only=tuple(c.ref() for c in only_new),
    )


def compare_inputs(
    baseline: Path,
    new: Path,
    signing: BundlePolicy | None,
    check: BundleCheck | None = None,
) -> Comparison:
    """Verify both sides (signatures under ``signing``), pair their cells, compare each."""
    old_certs = load_side(baseline, signing, check, baseline=True)
    new_certs = load_side(new, signing, check)
    return compare_loaded(old_certs, new_certs, str(baseline), str(new), signature_words(signing))


def comparison_path(cert_path: Path) -> Path:
    """Where a run writes its comparison: ``{cert stem}.compare.json`` beside the cert (a
    name the report and folder readers do not take for a cert)."""
    return cert_path.with_name(cert_path.stem + ".compare.json")


def compare_with_run(
    baseline: Sequence[LoadedSide], baseline_path: Path, cert: Cert, cert_path: Path, words: str
) -> Comparison:
    """The cert this run just wrote (built and checked by this process) against the verified
    ``baseline``."""
    return compare_loaded(
        baseline,
        [LoadedSide(cert_path, cert)],
        str(baseline_path),
        str(cert_path),
        f"baseline {words}; new cert written by this run",
    )
