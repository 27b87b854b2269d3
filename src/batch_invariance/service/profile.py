"""What a ``--profile`` contributes to a live request: the profile loaded and merged under
the command line's values (:mod:`batch_invariance.profiles`; explicit values win). The
profile-only options without a profile were refused by ``LiveRequest.check``.
"""

from __future__ import annotations

from typing import Any

from batch_invariance.engines.base import Engine
from batch_invariance.profiles.overrides import ProfileRun, resolve_profile_run
from batch_invariance.service.request import LiveRequest, check_server_flags

__all__ = ["resolve_profile"]


def resolve_profile(request: LiveRequest, engine: Engine) -> ProfileRun | None:
    """The profile's contribution; ``None`` without a profile name. The server flags it
    adds are checked against ``engine`` as the command line's were."""
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
    run = resolve_profile_run(profile.name, profile.model_alias, profile.models_dir, overrides)
    check_server_flags(engine, tuple(run.server_flags), request.driver_name)
    return run
