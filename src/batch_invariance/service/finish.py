"""From a measured cell to a written cert: :func:`finish_cell` (``verdict.decide``,
``certificate.build_cert``, ``certstore.write_cert``), and the out-dir check every entry point
runs before it measures anything.

The caller's provenance block (a live cell's:
:func:`batch_invariance.service.live.provenance_for`) is merged over the driver's own block
here. This module knows no job type: the live and mock services both finish through it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from batch_invariance.cert.provenance import Provenance
from batch_invariance.core.evidence import CellSpec, GatePolicy
from batch_invariance.errors import UsageError
from batch_invariance.run.records import CellRun, ModelTemplate

if TYPE_CHECKING:
    from batch_invariance.cert.certificate import Cert
    from batch_invariance.core.verdict import Verdict


__all__ = ["FinishedCell", "finish_cell", "prepare_out_dir", "utc_now"]


@dataclass(frozen=True)
class FinishedCell:
    """A cell whose cert was written."""

    cert: Cert
    verdict: Verdict
    path: Path
    superseded: Path | None
    #: The one promotability rule on the cert as built (exit 0 only when true).
    promotable: bool = False


def prepare_out_dir(out_dir: Path, flag: str = "--out-dir") -> Path:
    """Create the folder certs and logs go to, before the run: a bad folder must not cost a
    whole cell. UsageError when it cannot be created or written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {out_dir}: cannot create it ({exc.strerror or exc})") from None
    if not os.access(out_dir, os.W_OK):
        raise UsageError(f"{flag} {out_dir}: not writable")
    return out_dir


def utc_now() -> str:
    """The current UTC time as ``YYYY-MM-DDTHH:MM:SSZ`` (the shell's clock, not the core's)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def finish_cell(
    run: CellRun,
    spec: CellSpec,
    policy: GatePolicy,
    provenance: Provenance,
    out_dir: Path,
    ts_utc: str | None = None,
    model_template: ModelTemplate | None = None,
) -> FinishedCell:
    """Decide the verdict, build the cert and write it atomically into ``out_dir``.

    ``provenance`` from the caller (tool version, binary and model hashes, work-set sha256, ...)
    is merged with the run's own block (request template, servers, timings, chat template:
    ``model_template`` is what the model file's header said, where it was read); each key has
    one writer. The cert's ``source`` is the run's: what the launcher that started the servers
    is.
    """
    from batch_invariance.cert import certificate
    from batch_invariance.cert import store as certstore
    from batch_invariance.cert.advice import engine_advice
    from batch_invariance.cert.verify import Depth, verify
    from batch_invariance.core import verdict

    run_block = run.provenance(model_template)
    merged = provenance.merged_over(run_block)
    decided = verdict.decide(run.evidence, policy, engine_advice(merged.engine_name))
    cert = certificate.build_cert(
        run.evidence,
        decided,
        spec,
        policy,
        merged,
        run.source,
        ts_utc if ts_utc is not None else utc_now(),
    )
    written = certstore.write_cert(out_dir, cert)
    return FinishedCell(
        cert=cert,
        verdict=decided,
        path=written.path,
        superseded=written.superseded,
        promotable=verify(cert, Depth.BUILT, path=written.path).promotable,
    )
