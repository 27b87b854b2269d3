"""A live request as the user gave it: typed, not yet checked, and the entry points' defaults.

``run-live``, ``demo``, ``sweep``, the Action, the live tests and the live benchmark all build a
:class:`LiveRequest` (from argparse or from ``INPUT_*``). It is read once, by
:func:`batch_invariance.service.live.prepare`, which checks it into the job every later step
reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from batch_invariance.core.evidence import (
    DEFAULT_LOGIT_EPS,
    GatePolicy,
    policy_usage_problems,
)
from batch_invariance.core.plan import (
    CTX,
    PARALLEL,
    Measurement,
    NumberRule,
    number_field,
    number_problems,
)
from batch_invariance.engines.base import Engine, flag_conflicts
from batch_invariance.engines.registry import DEFAULT_ENGINE, ENGINES, engine_for
from batch_invariance.errors import UsageError
from batch_invariance.profiles.ladder import LADDER
from batch_invariance.service.endpoint import EndpointChoice
from batch_invariance.service.options import DEFAULT_READY_TIMEOUT, LaunchOptions

__all__ = [
    "ACTION_DEFAULTS",
    "DEFAULT_LOGIT_EPS",
    "DEFAULT_MIN_HOT_TRIALS",
    "DEFAULT_READY_TIMEOUT",
    "DEFAULT_REQ_TIMEOUT",
    "DEFAULT_SEED",
    "RUN_LIVE_DEFAULTS",
    "SWEEP_DEFAULTS",
    "AttachRequest",
    "CellDefaults",
    "CheckedRequest",
    "LiveRequest",
    "ProfileRequest",
]


@dataclass(frozen=True)
class CellDefaults:
    """Default cell options of one entry point (argparse and the Action read these)."""

    measurement: Measurement
    ctx: int | None = None
    parallel: int | None = None
    #: ``--endpoint`` (the Action's ``endpoint`` input): ``auto`` unless an entry point
    #: says otherwise (:mod:`batch_invariance.service.endpoint`).
    endpoint: EndpointChoice = "auto"


#: ``run-live`` (all three send ``--endpoint auto``; ``demo`` says its own endpoint, see
#: commands/demo.py): the default schedule (:data:`batch_invariance.core.plan.DEFAULT_GATE_PASSES`
#: passes of each row once, docs/power.md), ending the passes once RED is proven, when no
#: later pass can change the verdict.
RUN_LIVE_DEFAULTS = CellDefaults(Measurement(n_predict=128, stop_on_red=True))
#: The Action: run-live's cell, with the cell size its users get without asking.
ACTION_DEFAULTS = CellDefaults(RUN_LIVE_DEFAULTS.measurement, ctx=2048, parallel=4)
#: ``sweep``: run-live's cell.
SWEEP_DEFAULTS = CellDefaults(RUN_LIVE_DEFAULTS.measurement)
DEFAULT_SEED = Measurement().seed
#: The gate policy's own default (core/evidence.py), not a second copy.
DEFAULT_MIN_HOT_TRIALS = GatePolicy().min_hot_trials
DEFAULT_REQ_TIMEOUT = Measurement().req_timeout


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
class AttachRequest:
    """Attach mode: measure the server at ``base_url`` instead of launching one (``None``:
    the tool launches it)."""

    base_url: str | None = None
    metrics_url: str | None = None
    #: Allow a non-loopback ``base_url`` (recorded in the cert).
    allow_remote: bool = False


class CheckedRequest(NamedTuple):
    """What :meth:`LiveRequest.check` found: the engine, looked up once, and the values it
    made sure were given."""

    engine: Engine
    ctx: int
    parallel: int
    out_dir: Path


@dataclass(frozen=True)
class LiveRequest:
    """What the user asked a live cell to be, typed but not yet checked (see :func:`prepare`).

    Composed of the values the job and the plan carry: ``measurement`` (how every arm and
    pass is measured), ``launch`` (how the servers are launched), ``policy`` (the gates),
    ``attach`` and ``profile``. Every number's rule sits on its field
    (:func:`batch_invariance.core.plan.number_problems`).

    ``bundled_workset`` names the work-set shipped in the package that runs when neither
    ``workset`` nor a profile is given (``demo`` and the Action); ``model_name`` fixes the
    cert's model name (default: the profile's alias, else the model file name). ``engine``
    names the server (``engines.registry``).
    """

    out_dir: Path | None
    server_bin: Path | None = None
    model: Path | None = None
    workset: Path | None = None
    ctx: int | None = number_field(CTX, None)
    parallel: int | None = number_field(PARALLEL, None)
    measurement: Measurement = RUN_LIVE_DEFAULTS.measurement
    launch: LaunchOptions = field(default_factory=LaunchOptions)
    policy: GatePolicy = field(default_factory=GatePolicy)
    attach: AttachRequest = field(default_factory=AttachRequest)
    profile: ProfileRequest | None = None
    #: Turn the work-set into the prompt-cache shape, this many turns per conversation.
    cache_shape: int | None = number_field(NumberRule(1, why="turns per conversation"), None)
    server_flags: tuple[str, ...] = ()
    scorer: str | None = None
    port: int | None = None
    reserved_ports: tuple[int, ...] = ()
    #: What runs without ``--workset`` or a profile: the length ladder built for the cell
    #: (:mod:`batch_invariance.profiles.ladder`), or a bundled work-set by name.
    bundled_workset: str | None = LADDER
    model_name: str | None = None
    driver_name: str = "run-live"
    #: Which server (``--engine``); checked against ``engines.registry`` by :func:`prepare`.
    engine: str = DEFAULT_ENGINE
    #: ``--endpoint`` as given: ``auto`` is decided by :func:`prepare` from the model
    #: (:func:`~batch_invariance.service.endpoint.choose_endpoint`), and ``chat`` or
    #: ``completions`` replaces the measurement's; ``None``: the measurement's as it is.
    endpoint: EndpointChoice | None = None

    def check(self) -> CheckedRequest:
        """The cheap checks, all in one place and before any file, profile code or server is
        touched: the engine's name and what it takes (attach options, KV layout, the context
        multiple, the command line's server flags), required values, the numbers, the gate
        policy, a work-set source, the profile-only options without a profile (so a typo
        cannot silently do nothing), the prompt-cache options and the out-dir. Returns the
        engine, looked up once, with the values it made sure were given."""
        engine = engine_for(self.engine)
        if self.ctx is None or self.parallel is None:
            raise UsageError("--ctx and --parallel are required (tokens per slot, and N)")
        self._check_engine_options(engine)
        problems = number_problems(self) + policy_usage_problems(self.policy)
        if problems:
            raise UsageError(problems[0])
        profile = self.profile
        if profile is not None and not profile.name:
            for opt in ("model_alias", "models_dir", "models_file", "corner"):
                if getattr(profile, opt):
                    flag = "--" + opt.replace("_", "-")
                    raise UsageError(f"{flag} needs --profile; add --profile NAME or drop {flag}")
        has_profile = profile is not None and bool(profile.name)
        if self.workset is None and not has_profile and self.bundled_workset is None:
            raise UsageError("--workset FILE is required (or --profile NAME --model-alias ALIAS)")
        self._check_cache_options(has_profile)
        if self.out_dir is None:
            raise UsageError("--out-dir DIR is required (where the cert and server logs go)")
        return CheckedRequest(engine, self.ctx, self.parallel, self.out_dir)

    def _check_engine_options(self, engine: Engine) -> None:
        """What the engine takes, before anything of it is resolved: attach-only and
        launch-only options, a profile, the KV layout, the context multiple, the flags."""
        attached = self.attach.base_url is not None
        if not attached:
            if self.attach.metrics_url is not None:
                raise UsageError("--metrics-url goes with --base-url (attach mode)")
            if self.attach.allow_remote:
                raise UsageError("--allow-remote goes with --base-url (attach mode)")
        else:
            if self.server_flags:
                raise UsageError("--server-flag has no effect on an attached server; drop it")
            if self.server_bin is not None:
                raise UsageError("--server-bin has no effect on an attached server; drop it")
        has_profile = self.profile is not None and bool(self.profile.name)
        if has_profile and (attached or not engine.takes_profiles):
            takers = engines_that(lambda e: e.takes_profiles)
            raise UsageError(f"--profile works only with the default engine ({takers}, launched)")
        layout = self.launch.kv_layout
        if layout not in engine.kv_layouts or (layout != "split" and attached):
            takers = engines_that(lambda e: layout in e.kv_layouts)
            raise UsageError(f"--kv-layout {layout} applies only to {takers} launched by the tool")
        if not attached:
            _check_ctx(self.ctx, engine)
        check_server_flags(engine, self.server_flags, self.driver_name)

    def _check_cache_options(self, has_profile: bool) -> None:
        if self.cache_shape is not None and self.workset is None and has_profile:
            raise UsageError("--cache-shape needs a --workset FILE (a profile builds its own)")
        cache_passes = self.measurement.cache_passes
        if cache_passes and self.attach.base_url is not None:
            raise UsageError(
                "--cache-arm needs a server the tool launches: the prompt-cache arm runs on its "
                "own server with the cache on (drop --base-url)"
            )
        if self.launch.cache_ram is not None and not cache_passes:
            raise UsageError("--cache-ram sets the prompt-cache arm's server: give --cache-arm too")


def engines_that(can: Callable[[Engine], bool]) -> str:
    """The names of the engines that ``can``, for a usage error."""
    return ", ".join(sorted(e.name for e in ENGINES.values() if can(e)))


def check_server_flags(engine: Engine, flags: tuple[str, ...], driver: str) -> None:
    """Refuse a server flag that conflicts with what the tool sets or measures (the command
    line's here; a profile's, once the profile is loaded)."""
    problems = flag_conflicts(engine, flags)
    if problems:
        raise UsageError(
            f"--server-flag {problems[0]} (it conflicts with what {driver} sets or measures: "
            f"drop it, or use the {driver} option)"
        )


def _check_ctx(ctx: int | None, engine: Engine) -> None:
    step = engine.ctx_multiple
    if ctx is None or ctx <= 0 or ctx % step == 0:
        return
    up = -(-ctx // step) * step
    down = up - step
    fix = f"--ctx {down} or {up}" if down > 0 else f"--ctx {up}"
    raise UsageError(
        f"--ctx {ctx}: {engine.name} rounds the context per slot up to a multiple of {step}, "
        f"so it would run {up} and the cert would not name what ran; use {fix}"
    )
