"""What a ``--profile`` contributes to a live request: the profile loaded and merged under
the command line's values (:mod:`batch_invariance.profiles`; explicit values win). The
profile-only options without a profile were refused by ``LiveRequest.check``.
"""

from __future__ import annotations

from typing import Any

from batch_invariance.profiles.overrides import ProfileRun, resolve_profile_run
from batch_invariance.service.request import LiveRequest

__all__ = ["resolve_profile"]


def resolve_profile(request: LiveRequest) -> ProfileRun | None:
    """The profile's contribution; ``None`` without a profile name."""
    profile = request.profile
    if profile is None or not profile.name:
        return None
    overrides: dict[str, Any] = {
        "server_bin": None if request.server_bin is None else str(request.server_bin),
        "model": None if request.model is None else str(request.model),
        "server_flags": tuple(request.server_flags),
        "scorer": request.scorer,
        "models_file": profile.models_file,
        "corner": profile.corner,
        "seed": profile.seed,
    }
    return resolve_profile_run(profile.name, profile.model_alias, profile.models_dir, overrides)
