"""The deploy gate: a cert covers a deploy cell (:mod:`batch_invariance.gate.cells`)
only if it measured exactly that cell (the rules: :mod:`batch_invariance.gate.coverage`),
and every cert that did is valid, promotable and signed (unless ``--allow-unsigned``).

A cert that agrees on everything checkable here while the model file or server binary (or a
llama.cpp library beside it) cannot be read on this machine makes the cell ``unverifiable``
(not covered, not ``missing`` either). A deploy with no ``-n`` cap passes only with the
measured answer length printed as its scope. Each cert file is read once; one that is not
JSON is named and skipped, one that fails verification and claims the cell fails it as
invalid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, Protocol

from batch_invariance.cert.signature import BundlePolicy, SignerPolicy, TrustRoot, verify_bundle
from batch_invariance.cert.signing import bundle_path_for
from batch_invariance.core.gpu_placement import placement_differences
from batch_invariance.errors import CertInvalid
from batch_invariance.gate.cells import DeployCell
from batch_invariance.gate.certs import CertFile, CertIndex, measured_length
from batch_invariance.gate.coverage import config_differences, uncapped
from batch_invariance.gate.identity import (
    BuildIdentity,
    ModelIdentity,
    build_differences,
    identity_gaps,
)

CheckKind = Literal[
    "ok", "missing", "unverifiable", "not_promotable", "invalid", "unknown", "unsigned", "raw"
]


class BundleVerifier(Protocol):
    """Checks that ``bundle`` signs ``artifact`` for ``signer``; raises CertInvalid if not."""

    def __call__(
        self, artifact: Path, bundle: Path, wanted: SignerPolicy, trust: TrustRoot
    ) -> None: ...


@dataclass(frozen=True)
class CellCheck:
    cell: DeployCell
    kind: CheckKind
    reason: str
    cert: Path | None = None
    #: The longest answer the covering cert measured, when the deploy sets no ``-n`` cap:
    #: what a pass covers (longer answers were never compared).
    answers_up_to: int | None = None

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


class SignatureProblem(NamedTuple):
    """Why a cert's signature does not hold: the check's kind and a one-line reason."""

    kind: CheckKind
    reason: str


def signature_problem(
    cert: CertFile, policy: BundlePolicy, verify: BundleVerifier
) -> SignatureProblem | None:
    bundle = bundle_path_for(cert.path)
    if not bundle.is_file():
        why = f"cert {cert.path.name} is not signed (no {bundle.name} beside it)"
        return SignatureProblem("unsigned", why)
    try:
        verify(cert.path, bundle, policy.signer, policy.trust)
    except CertInvalid as exc:
        return SignatureProblem("invalid", f"cert {cert.path.name}: {exc}")
    return None


def check_cell(
    cell: DeployCell,
    index: CertIndex,
    model: ModelIdentity,
    build: BuildIdentity,
    signing: BundlePolicy | None,
    verify: BundleVerifier = verify_bundle,
) -> CellCheck:
    """Decide one cell: a cert must have measured it, and every such cert must pass."""
    if cell.not_covered:
        return CellCheck(cell, "unknown", "; ".join(cell.not_covered))
    if cell.ctx is None:
        why = (
            "context per slot unknown (no -c/--ctx-size and the model file is not readable "
            "here); set -c explicitly in the deploy config"
        )
        return CellCheck(cell, "unknown", why)
    claims = [c for c in index.certs if (c.ctx, c.n) == (cell.ctx, cell.parallel)]
    for cert in claims:
        if cert.problem is not None and cert.model == cell.name:
            return CellCheck(cell, "invalid", f"cert {cert.path.name} is invalid: {cert.problem}")
    valid = [c for c in claims if c.problem is None]
    diffs = {
        c.path: config_differences(cell, c, model) + build_differences(build, c.provenance)
        for c in valid
    }
    same = [c for c in valid if not diffs[c.path]]
    if not same:
        return _uncovered(cell, index, valid, diffs, (model, build))
    for cert in same:
        if not cert.promotable:
            reason = f"cert {cert.path.name} is not promotable ({cert.not_promotable})"
            return CellCheck(cell, "not_promotable", reason, cert.path)
        if signing is not None:
            bad = signature_problem(cert, signing, verify)
            if bad is not None:
                return CellCheck(cell, bad.kind, bad.reason, cert.path)
    names = ", ".join(c.path.name for c in same)
    scope: int | None = None
    scope_text = ""
    if uncapped(cell):
        scope = min(length for c in same if (length := measured_length(c)) is not None)
        scope_text = f"; covers answers up to {scope} tokens only: the deploy sets no -n cap"
    if signing is None:
        signed = "UNSIGNED: --allow-unsigned"
    elif signing.signer.repository:
        signed = f"signature verified, signed for {signing.signer.repository}"
    else:
        signed = "signature verified for any repository: --any-repository"
    unchecked = placement_differences(same[-1].provenance.gpus, cell.gpus).unchecked
    placed = f"; {unchecked}" if unchecked else ""
    libraries = build.libraries.sha256 if build.libraries is not None else ()
    beside = f" and its {len(libraries)} llama.cpp libraries" if libraries else ""
    reason = (
        f"promotable cert: {names} (model by {model.method}, build by sha256 of "
        f"{build.shown}{beside}; {signed}){placed}{scope_text}"
    )
    return CellCheck(cell, "ok", reason, same[-1].path, scope)


def _uncovered(
    cell: DeployCell,
    index: CertIndex,
    valid: Sequence[CertFile],
    diffs: dict[Path, tuple[str, ...]],
    identity: tuple[ModelIdentity, BuildIdentity],
) -> CellCheck:
    """No valid cert provably measured the cell: ``unverifiable`` when one agrees on all
    that can be checked here and only what this machine cannot identify stands between (the
    model file, then named as the cell names it, or the server binary), else ``missing``."""
    model, build = identity
    gaps = identity_gaps(model, build)
    found = [
        c for c in valid if set(diffs[c.path]) <= set(gaps)
        and (model.method != "nothing" or c.model == cell.name)
    ]  # fmt: skip
    if found:
        reason = (
            f"cert {found[-1].path.name} agrees on everything checkable here, but this machine "
            f"cannot tell whether it measured this deploy: {'; '.join(gaps)}"
        )
        return CellCheck(cell, "unverifiable", reason, found[-1].path)
    hint = f"; unreadable files: {', '.join(index.unreadable)}" if index.unreadable else ""
    if not valid:
        return CellCheck(cell, "missing", f"no cert for {cell.label} (run the cell){hint}")
    shown = "; ".join(f"{c.path.name}: {', '.join(diffs[c.path])}" for c in valid)
    return CellCheck(cell, "missing", f"no cert measured this cell ({shown}){hint}")
