"""What a ``--profile`` contributes to a live request: the profile loaded and merged under
the command line's values (:mod:`batch_invariance.profiles`; explicit values win). The
profile-only options without a profile were refused by ``LiveRequest.check``.

And the work-set the cell measures (:func:`resolve_workset`): the ``--workset`` file, the
profile's, the length ladder or a bundled one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batch_invariance.engines.base import Engine
from batch_invariance.profiles.ladder import LADDER, ladder_builder
from batch_invariance.profiles.overrides import ProfileRun, resolve_profile_run
from batch_invariance.profiles.tokens import TokenCounter, approx_token_count
from batch_invariance.run.workset import (
    Workset,
    bundled_workset_path,
    load_workset,
    shaped_for_cache,
)
from batch_invariance.service.request import CheckedRequest, LiveRequest, check_server_flags

__all__ = ["CACHE_SHAPE_SOURCE", "resolve_profile", "resolve_workset"]


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


#: The bundled rows ``--cache-shape`` shapes when no ``--workset`` is given.
CACHE_SHAPE_SOURCE = "demo_completions"


def _ladder(
    request: LiveRequest, engine: Engine, ctx: int
) -> tuple[Callable[[int, TokenCounter], Workset] | None, Workset | None]:
    """The length ladder for the cell: built on the A server's own ``/tokenize`` where the
    tool launches a llama-server (as a profile's work-set is), else now, with the offline
    estimate. Either way it is first planned offline, so a slot too small for it is refused
    here, before anything launches."""
    m = request.measurement
    # A unified pool (any slot may fill it) adds the pool's long rungs, co-batched.
    unified = request.launch.kv_layout == "unified" and (request.parallel or 1) > 1
    pool_n = request.parallel if unified else None
    offline = ladder_builder(m.n_predict, m.seed, "the offline estimate", pool_n)
    preview = offline(ctx, approx_token_count)
    if engine.takes_profiles and request.attach.base_url is None:
        return ladder_builder(m.n_predict, m.seed, "the A server's /tokenize", pool_n), None
    return None, preview


def resolve_workset(
    request: LiveRequest, checked: CheckedRequest, prof: ProfileRun | None
) -> tuple[Callable[[int, TokenCounter], Workset] | None, Workset | None]:
    """The cell's work-set, or how to build it once the A server can count tokens: the
    ``--workset`` file, a profile's, the length ladder or a bundled one (the prompt-cache
    shape applied where asked)."""
    builder: Callable[[int, TokenCounter], Workset] | None = None
    workset: Workset | None = None
    bundled = request.bundled_workset
    if request.workset is not None:
        workset = load_workset(request.workset)
    elif prof is not None:
        builder = prof.build_workset
    elif bundled == LADDER and request.cache_shape is None:
        builder, workset = _ladder(request, checked.engine, checked.ctx)
    elif bundled is not None:
        # The prompt-cache shape turns rows into growing conversations: it starts from the
        # short completion openings, not from prompts that already fill the slot.
        source = CACHE_SHAPE_SOURCE if bundled == LADDER else bundled
        workset = load_workset(bundled_workset_path(source))
    if request.cache_shape is not None and workset is not None:  # a profile's is not shaped
        workset = shaped_for_cache(workset, request.cache_shape)
    return builder, workset
