"""What a measurement profile (``--profile``) contributes to a live cell.

Explicit request values beat the profile (the profile layer merges them). Without a
profile, the profile-only options are refused so a typo cannot silently do nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batch_invariance.cert.provenance import ProfileRecord
from batch_invariance.core.scoring import Scorer
from batch_invariance.errors import UsageError
from batch_invariance.run.workset import Workset

if TYPE_CHECKING:
    from batch_invariance.service.request import LiveRequest


__all__ = ["ProfileInputs", "ProfileRequest", "resolve_profile"]


@dataclass(frozen=True)
class ProfileRequest:
    """The profile options of a live request (``--profile`` and the options that need it)."""

    name: str | None = None
    model_alias: str | None = None
    models_dir: str | None = None
    models_file: str | None = None
    corner: str | None = None
    seed: int | None = None


@dataclass(frozen=True)
class ProfileInputs:
    """What a profile contributes to a live run.

    ``build_workset`` is called with ``(ctx, token_counter)`` once a calibration server is up;
    ``None`` means the run uses ``--workset``.
    """

    server_bin: Path | None
    model: Path | None
    server_flags: tuple[str, ...]
    scorer: Scorer
    model_name: str | None
    build_workset: Callable[[int, Callable[[str], int]], Workset] | None
    provenance: ProfileRecord


def resolve_profile(profile: ProfileRequest | None, request: LiveRequest) -> ProfileInputs | None:
    """The profile's contribution; ``None`` without a profile name."""
    if profile is None or not profile.name:
        if profile is not None:
            for opt in ("model_alias", "models_dir", "models_file", "corner"):
                if getattr(profile, opt):
                    flag = "--" + opt.replace("_", "-")
                    raise UsageError(f"{flag} needs --profile; add --profile NAME or drop {flag}")
        return None
    from batch_invariance.profiles import resolve_profile_run

    overrides: dict[str, Any] = {
        "server_bin": None if request.server_bin is None else str(request.server_bin),
        "model": None if request.model is None else str(request.model),
        "server_flags": tuple(request.server_flags),
        "scorer": request.scorer,
        "models_file": profile.models_file,
        "corner": profile.corner,
        "seed": profile.seed,
    }
    run = resolve_profile_run(profile.name, profile.model_alias, profile.models_dir, overrides)

    def build(ctx: int, counter: Callable[[str], int]) -> Workset:
        return run.build_workset(ctx, counter)

    return ProfileInputs(
        server_bin=None if run.server_bin is None else Path(run.server_bin),
        model=None if run.model is None else Path(run.model),
        server_flags=tuple(run.server_flags),
        scorer=run.scorer,
        model_name=run.model_alias,
        build_workset=None if request.workset is not None else build,
        provenance=ProfileRecord.from_record(
            {
                "name": run.profile.name,
                "corner": run.corner,
                "seed": run.seed,
                "model_alias": run.model_alias,
                "models_toml": run.models_toml,
                "kv": run.kv,
            }
        ),
    )
