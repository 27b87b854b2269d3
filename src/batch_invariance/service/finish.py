"""From a measured cell to a written cert: :func:`finish_cell` (``verdict.decide``,
``certificate.build_cert``, ``certstore.write_cert``), and the out-dir check every entry point
runs before it measures anything.

The provenance block a live cell adds to its cert: tool, engine, binary, model, work-set,
host, memory guard, attach record and profile (merged over the driver's own block in
``finish_cell``). One builder for every engine, launched or attached.
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


from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from batch_invariance import __version__
from batch_invariance.cert.provenance import BinaryRecord, ModelFileRecord
from batch_invariance.core.gpu_placement import GpuPlacement, unread_placement
from batch_invariance.host import facts as hostinfo
from batch_invariance.host.gpus import placement_here
from batch_invariance.run.workset import Workset
from batch_invariance.servers.launch import LaunchRecord

if TYPE_CHECKING:
    from batch_invariance.service.live import LiveCell
    from batch_invariance.service.target import ServerTarget, TargetIdentity


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


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _model_file(target: ServerTarget, sha256: str | None) -> ModelFileRecord | None:
    model = target.model
    if model is None or target.attach is not None:
        return None  # attached: the tool cannot say which file the server loaded
    gguf = target.gguf
    if gguf is None:
        return ModelFileRecord(path=str(model), name=model.name, sha256=sha256, size=None,
                               gguf=None, gguf_skipped=target.gguf_skipped)  # fmt: skip
    return ModelFileRecord(path=str(model), name=model.name, sha256=sha256,
                           size=gguf.file_size, gguf=gguf.summary())  # fmt: skip


def _gpus(cell: LiveCell) -> GpuPlacement:
    """The GPUs the launched servers see: they inherit this process's selection variables."""
    if cell.target.attach is not None:
        return unread_placement("an attached server: the tool cannot see its GPUs")
    return placement_here(os.environ)


def _memory_guard(cell: LiveCell, launches: Sequence[LaunchRecord]) -> dict[str, Any]:
    target = cell.target
    if target.gguf is None and target.hf_model is None:
        return {"max_footprint_gb": cell.launch.max_footprint_gb, "applied": False,
                "reason": target.gguf_skipped}  # fmt: skip
    return {
        "max_footprint_gb": cell.launch.max_footprint_gb,
        "launches": [
            {
                "arm": r.arm,
                "parallel": r.parallel,
                "ctx_per_slot": r.ctx,
                "projected_bytes": r.projected_bytes,
                # The share of its memory node the server reserved (vLLM), where it did.
                **({} if r.memory_fraction is None else {"memory_fraction": r.memory_fraction}),
                "rss_peak_bytes": r.rss_peak_bytes,
                "ready_s": _round(r.ready_s),
                "alive_s": _round(r.alive_s),
            }
            for r in launches
        ],
    }


def _binary(identity: TargetIdentity) -> BinaryRecord | None:
    binary = identity.binary
    if binary is None:
        return None
    return BinaryRecord(path=binary.path, sha256=binary.sha256, version=binary.version,
                        version_rc=binary.version_rc)  # fmt: skip


def provenance_for(
    cell: LiveCell,
    workset: Workset,
    launches: Sequence[LaunchRecord],
    n_items: int,
    identity: TargetIdentity,
) -> Provenance:
    """The caller's provenance block of a live cell (``launches``: the servers this cell
    used; a sweep's launcher also started others)."""
    target = cell.target
    gguf = target.gguf
    # The work-set's record first: what the cell ran, before what it ran on.
    workset_record = {**workset.record(), "n_items": n_items}
    block = Provenance(
        tool_version=__version__,
        driver=cell.driver,
        engine=target.engine.name,
        server_binary=_binary(identity),
        model_file=_model_file(target, identity.model_sha256),
        is_moe=gguf.is_moe if gguf is not None else None,
        workset=workset_record,
        server_flags=tuple(cell.server_flags),
        host=hostinfo.summary(),
        gpus=_gpus(cell).record(),
        memory_guard=_memory_guard(cell, launches),
        profile=cell.profile,
    )
    if target.attach is None:
        return block
    return block.model_copy(update={"attach": target.attach.to_record()})
