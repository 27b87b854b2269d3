"""The ``--json`` objects of ``verify-cert``, ``run-live`` and ``sweep`` (docs/output-contract.md,
"`--json`"). ``check-deploy``'s is :class:`~batch_invariance.deploy.outcome.DeployOutcome`.

Each is a frozen dataclass whose fields are the object's keys (plus ``command`` and
``json_version``); the builders are pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from batch_invariance.cert.certificate import Cert
from batch_invariance.cert.verify import Verification

#: Names the layout of these objects; bumps on any change of keys.
JSON_VERSION = 1

SignatureState = Literal["verified", "failed", "not_checked"]


@dataclass(frozen=True)
class Signature:
    state: SignatureState
    detail: str


@dataclass(frozen=True)
class VerifyReply:
    """What ``verify-cert --json`` prints."""

    cert: str
    #: Schema, digest, version, re-derived verdict and identity all hold.
    valid: bool
    #: The cell and verdict as the cert states them (``None`` when it could not be parsed).
    model: str | None
    ctx: int | None
    dispatch_n: int | None
    source: str | None
    status: str | None
    verdict: str | None
    promotable: bool
    #: Why it is (one line) or is not (each unmet condition) promotable.
    promotable_reasons: tuple[str, ...]
    signature: Signature
    #: Why the cert is invalid, first problem first (empty when valid).
    problems: tuple[str, ...]
    exit_code: int

    def to_json(self) -> dict[str, Any]:
        return {"command": "verify-cert", "json_version": JSON_VERSION, **asdict(self)}


def verify_reply(
    verification: Verification, path: Path, signature: Signature, exit_code: int
) -> VerifyReply:
    cert = verification.cert
    return VerifyReply(
        cert=str(path),
        valid=verification.valid,
        model=None if cert is None else cert.model,
        ctx=None if cert is None else cert.ctx,
        dispatch_n=None if cert is None else cert.dispatch_n,
        source=None if cert is None else str(cert.source),
        status=verification.status,
        verdict=verification.verdict if cert is not None else None,
        promotable=verification.promotable and verification.valid,
        promotable_reasons=tuple(verification.promotable_reasons),
        signature=signature,
        problems=tuple(verification.problems),
        exit_code=exit_code,
    )


@dataclass(frozen=True)
class RunCell:
    """One N of a run: the cert written for it, or why it did not run."""

    parallel: int
    cert: str | None
    #: The older cert at that name, renamed aside (``None``: there was none).
    superseded: str | None
    status: str | None
    verdict: str | None
    promotable: bool
    #: Why this N did not run (the memory guard refused it); ``None`` when it ran.
    not_run: str | None


def run_cell(
    parallel: int, cert: Cert, path: Path, superseded: Path | None, promotable: bool
) -> RunCell:
    return RunCell(
        parallel=parallel,
        cert=str(path),
        superseded=None if superseded is None else str(superseded),
        status=str(cert.status),
        verdict=str(cert.verdict),
        promotable=promotable,
        not_run=None,
    )


def refused_cell(parallel: int, why: str) -> RunCell:
    return RunCell(parallel, None, None, None, None, False, why)


@dataclass(frozen=True)
class RunReply:
    """What ``run-live --json`` and ``sweep --json`` print."""

    command: Literal["run-live", "sweep"]
    #: One per N (``run-live``: exactly one), in ``--parallel`` order.
    cells: tuple[RunCell, ...]
    #: Every N ran and its cert is promotable.
    promotable: bool
    #: ``sweep``: the sweep.json written, and the largest N promotable GREEN with every
    #: smaller N too; ``None`` for ``run-live``.
    sweep: str | None
    max_safe_parallel: int | None
    #: ``run-live --baseline``: the comparison JSON written beside the cert.
    comparison: str | None
    exit_code: int

    def to_json(self) -> dict[str, Any]:
        return {"json_version": JSON_VERSION, **asdict(self)}


def run_reply(
    command: Literal["run-live", "sweep"],
    cells: Sequence[RunCell],
    exit_code: int,
    *,
    sweep: Path | None = None,
    max_safe_parallel: int | None = None,
    comparison: Path | None = None,
) -> RunReply:
    return RunReply(
        command=command,
        cells=tuple(cells),
        promotable=bool(cells) and all(c.promotable for c in cells),
        sweep=None if sweep is None else str(sweep),
        max_safe_parallel=max_safe_parallel,
        comparison=None if comparison is None else str(comparison),
        exit_code=exit_code,
    )
