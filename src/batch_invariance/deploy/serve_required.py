"""A PASS means: this deploy starts ``batch-invariance serve``, and the cell its line asks for
has a promotable cert signed per the gate's policy. ``serve`` proves the cell at start; a server
the deploy starts directly is never a pass (the check names its cell, the cert that covers it
if any and the serve line to write). A serve line passes only where its own signing policy is
no looser than the gate's, and in a container only in an image whose digest the gate names.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from batch_invariance.cert.option_table import POLICY_OPTIONS
from batch_invariance.cert.signature import BundlePolicy
from batch_invariance.cert.signing_policy import signing_policy
from batch_invariance.deploy.deploy_report import DeployReport
from batch_invariance.deploy.readers.compose_service import image_tag
from batch_invariance.errors import UsageError
from batch_invariance.gate.check import CellCheck


def _policy_words(gate: BundlePolicy | None) -> list[str]:
    """The serve options that give a serve line the gate's own signing policy."""
    if gate is None:
        return ["--allow-unsigned"]
    signer = gate.signer
    which = "--cert-identity-regexp" if signer.identity_is_regexp else "--cert-identity"
    words = [which, signer.identity, "--cert-oidc-issuer", signer.issuer]
    words += ["--repository", signer.repository] if signer.repository else ["--any-repository"]
    return words


def serve_suggestion(
    argv: tuple[str, ...], certs: Path, gate: BundlePolicy | None, program: str = "batch-invariance"
) -> str:
    """The serve line that starts this engine command under the contract, with the gate's
    signing policy (so the line passes the gate that suggested it); ``program`` is how the
    line names this tool (a bare name where the serving host's path is not known here)."""
    own = shlex.join(["--certs", str(certs), *_policy_words(gate)])
    return f"{shlex.quote(program)} serve {own} -- {shlex.join(argv)}"


def _line_policy(options: tuple[tuple[str, str], ...]) -> BundlePolicy | None:
    """The signing policy ``serve`` applies to its line's own options."""
    given = dict(options)
    values: dict[str, object] = {}
    for option in POLICY_OPTIONS:
        raw = given.get(option.name)
        if option.kind == "flag":
            values[option.dest] = option.name in given
        elif option.kind == "path":
            values[option.dest] = None if raw is None else Path(raw)
        else:
            values[option.dest] = raw
    return signing_policy(SimpleNamespace(**values), "serve")


def _policy_problem(options: tuple[tuple[str, str], ...], gate: BundlePolicy | None) -> str | None:
    """Why the serve line would start a cert the gate would not accept, or ``None``."""
    try:
        line = _line_policy(options)
    except UsageError as exc:
        return f"serve would refuse its line: {exc}"
    if gate is None:
        return None
    if line is None:
        return (
            "the serve line accepts unsigned certs (--allow-unsigned) while the gate requires "
            "signatures: drop --allow-unsigned and give the gate's identity policy"
        )
    if (line.signer, line.trust.staging) != (gate.signer, gate.trust.staging):
        return (
            f"the serve line trusts signer {line.signer.identity} ({line.signer.issuer}, "
            f"repository {line.signer.repository or 'any'}), not the gate's "
            f"{gate.signer.identity}: give it the gate's identity policy"
        )
    return None


def _image_problem(image: str, serve_images: frozenset[str]) -> str | None:
    """Why a serve line in a container does not run the serve program the gate names."""
    digest = image_tag(image)[2]
    if digest and digest in serve_images:
        return None
    named = ", ".join(sorted(serve_images)) or "none"
    return (
        f"serve runs in image {image}, whose digest the gate does not name (--serve-image: "
        f"{named}); build the image from docker/serve.Dockerfile, pin it by digest and name "
        "that digest with --serve-image"
    )


def launch_check(
    check: CellCheck,
    certs: Path,
    gate: BundlePolicy | None,
    serve_images: frozenset[str] = frozenset(),
) -> CellCheck:
    """``check`` (the cell's coverage) as the gate decides it for the way the deploy starts it:
    a server started directly is never a pass; a serve line in a container passes only in an
    image whose digest the gate names (``serve_images``)."""
    cell = check.cell
    if cell.serve_options is None:
        covered = (
            f"cert {check.cert.name} covers this cell"
            if check.ok and check.cert is not None
            else check.reason
        )
        dropped = (
            "; write its LLAMA_ARG_* settings as flags: serve drops those variables"
            if any(option.from_env for option in cell.flags.options)
            else ""
        )
        reason = (
            f"starts {cell.binary} directly, which is never a pass: batch-invariance serve "
            f"proves the cell on the serving host at start ({covered}); start it as: "
            f"{serve_suggestion(cell.argv, certs, gate)}{dropped}"
        )
        # An invalid cert keeps its own kind (and exit 5): it is the first thing to fix.
        return replace(check, kind="invalid" if check.kind == "invalid" else "raw", reason=reason)
    if cell.image is not None and (problem := _image_problem(cell.image, serve_images)):
        return replace(check, kind="unknown", reason=problem)
    problem = _policy_problem(cell.serve_options, gate)
    if problem is not None and check.ok:
        return replace(check, kind="unsigned", reason=problem)
    return check


def gate_report(
    report: DeployReport,
    certs: Path,
    gate: BundlePolicy | None,
    serve_images: frozenset[str] = frozenset(),
) -> DeployReport:
    """The report with every cell decided for the way the deploy starts it."""
    checks = tuple(launch_check(c, certs, gate, serve_images) for c in report.checks)
    return replace(report, checks=checks)
