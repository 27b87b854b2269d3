"""The provenance block a live cell adds to its cert: tool, binary, model, work-set, host,
memory guard and profile (merged over the driver's own block in ``finish_cell``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batch_invariance import __version__
from batch_invariance.core.chat_template import judge_chat_template, sends_chat
from batch_invariance.engines import host as hostinfo
from batch_invariance.engines.live_launcher import BinaryIdentity, LiveLauncher
from batch_invariance.run.workset import Workset

if TYPE_CHECKING:
    from batch_invariance.run.live import LiveCell


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def provenance_for(
    cell: LiveCell,
    workset: Workset,
    launcher: LiveLauncher,
    n_items: int,
    binary: BinaryIdentity,
    model_sha: str,
) -> dict[str, Any]:
    """The caller's provenance block of a live cell."""
    return {
        "tool_version": __version__,
        "driver": cell.request.driver_name,
        "server_binary": {
            "path": binary.path,
            "sha256": binary.sha256,
            "version": binary.version,
            "version_rc": binary.version_rc,
        },
        "model_file": {
            "path": str(cell.model),
            "name": cell.model.name,
            "sha256": model_sha,
            "size": cell.gguf.file_size,
            "gguf": cell.gguf.summary(),
        },
        "is_moe": cell.gguf.is_moe,
        "workset": {
            "source": workset.source,
            "sha256": workset.sha256,
            "n_rows": len(workset.items),
            "n_items": n_items,
        },
        "server_flags": list(cell.server_flags),
        "host": hostinfo.summary(),
        "memory_guard": {
            "max_footprint_gb": cell.request.max_footprint_gb,
            "launches": [
                {
                    "arm": r.arm,
                    "parallel": r.parallel,
                    "ctx_per_slot": r.ctx,
                    "projected_bytes": r.projected_bytes,
                    "rss_peak_bytes": r.rss_peak_bytes,
                    "ready_s": _round(r.ready_s),
                    "alive_s": _round(r.alive_s),
                }
                for r in launcher.launches
            ],
        },
        "profile": None if cell.profile is None else dict(cell.profile),
        # The model file says whether the template is the model's own or the server's fallback.
        "chat_template": judge_chat_template(
            uses_chat=sends_chat(cell.request.endpoint, workset.items),
            server_argv=cell.server_flags,
            server_template=None,
            model_read=True,
            model_template=cell.gguf.chat_template,
        ).to_record(),
    }
