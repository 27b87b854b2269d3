"""A live request as the user gave it: typed, not yet checked, and the entry points' defaults.

``run-live``, ``demo``, ``sweep``, the Action, the live tests and the live benchmark all build a
:class:`LiveRequest` (from argparse or from ``INPUT_*``). It is read once, by
:func:`batch_invariance.service.job.prepare`, which checks it into the job every later step
reads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from batch_invariance.core.evidence import (
    DEFAULT_LOGIT_EPS,
    DEFAULT_MAX_BOUND,
    DEFAULT_MIN_ANSWER_TOKENS,
    GatePolicy,
    policy_usage_problems,
)
from batch_invariance.core.plan import Endpoint, number_problems
from batch_invariance.engines.base import KvLayout
from batch_invariance.engines.registry import DEFAULT_ENGINE, engine_for
from batch_invariance.errors import UsageError

__all__ = [
    "ACTION_DEFAULTS",
    "DEFAULT_LOGIT_EPS",
    "DEFAULT_MIN_HOT_TRIALS",
    "DEFAULT_READY_TIMEOUT",
    "DEFAULT_REQ_TIMEOUT",
    "DEFAULT_SEED",
    "RUN_LIVE_DEFAULTS",
    "SWEEP_DEFAULTS",
    "CellDefaults",
    "LiveRequest",
    "ProfileRequest",
]


@dataclass(frozen=True)
class CellDefaults:
    """Default cell options of one entry point (argparse and the Action read these)."""

    gate_passes: int
    reps: int
    n_predict: int
    endpoint: Endpoint = "chat"
    ctx: int | None = None
    parallel: int | None = None
    #: End the cell at the first C pass that proves RED (``--stop-on-red``).
    stop_on_red: bool = False


#: ``run-live`` (and the Action, which adds the cell size its users get without asking).
RUN_LIVE_DEFAULTS = CellDefaults(gate_passes=8, reps=3, n_predict=128)
ACTION_DEFAULTS = replace(RUN_LIVE_DEFAULTS, ctx=2048, parallel=4, stop_on_red=True)
#: ``sweep``: run-live's cell, ending each cell once RED is proven.
SWEEP_DEFAULTS = replace(RUN_LIVE_DEFAULTS, stop_on_red=True)
DEFAULT_SEED = 0
#: The gate policy's own default (core/evidence.py), not a second copy.
DEFAULT_MIN_HOT_TRIALS = GatePolicy().min_hot_trials
DEFAULT_READY_TIMEOUT = 300.0
DEFAULT_REQ_TIMEOUT = 120.0


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
class LiveRequest:
    """What the user asked a live cell to be, typed but not yet checked (see :func:`prepare`).

    ``bundled_workset`` names the work-set shipped in the package that runs when neither
    ``workset`` nor a profile is given (``demo`` and the Action); ``model_name`` fixes the
    cert's model name (default: the profile's alias, else the model file name). ``engine``
    names the server (``engines.registry``); ``base_url`` attaches to a running one instead
    of launching it.
    """

    out_dir: Path | None
    server_bin: Path | None = None
    model: Path | None = None
    workset: Path | None = None
    ctx: int | None = None
    parallel: int | None = None
    gate_passes: int = RUN_LIVE_DEFAULTS.gate_passes
    reps: int = RUN_LIVE_DEFAULTS.reps
    n_predict: int = RUN_LIVE_DEFAULTS.n_predict
    seed: int = DEFAULT_SEED
    endpoint: Endpoint = "chat"
    n_probs: int | None = None
    logit_eps: float = DEFAULT_LOGIT_EPS
    min_hot_trials: int = DEFAULT_MIN_HOT_TRIALS
    min_answer_tokens: int = DEFAULT_MIN_ANSWER_TOKENS
    max_bound: float = DEFAULT_MAX_BOUND
    serial_repeat: bool = True
    stop_on_red: bool = False
    req_timeout: float = DEFAULT_REQ_TIMEOUT
    ready_timeout: float = DEFAULT_READY_TIMEOUT
    max_footprint_gb: float | None = None
    server_flags: tuple[str, ...] = ()
    scorer: str | None = None
    port: int | None = None
    reserved_ports: tuple[int, ...] = ()
    profile: ProfileRequest | None = None
    bundled_workset: str | None = None
    model_name: str | None = None
    driver_name: str = "run-live"
    #: KV layout of the B/C server: split (every slot owns ctx) or unified (one ctx*N pool).
    kv_layout: KvLayout = "split"
    #: Which server (``--engine``); checked against ``engines.registry`` by :func:`prepare`.
    engine: str = DEFAULT_ENGINE
    #: Attach mode: measure the server at this URL instead of launching one.
    base_url: str | None = None
    metrics_url: str | None = None
    #: Allow a non-loopback ``base_url`` (recorded in the cert).
    allow_remote: bool = False
    #: Passes of the prompt-cache arm (``--cache-arm``: 1); 0 leaves the cache unmeasured.
    cache_passes: int = 0
    #: llama-server's ``--cache-ram`` (MiB) under test on the prompt-cache arm's server;
    #: ``None``: the server's own default.
    cache_ram: int | None = None
    #: Turn the work-set into the prompt-cache shape, this many turns per conversation.
    cache_shape: int | None = None

    def number_problems(self) -> tuple[str, ...]:
        """What is wrong with the numbers (the one table in :mod:`batch_invariance.core.plan`)."""
        return number_problems(
            {
                "ctx": self.ctx,
                "parallel": self.parallel,
                "gate_passes": self.gate_passes,
                "reps": self.reps,
                "n_predict": self.n_predict,
                "min_hot_trials": self.min_hot_trials,
                "n_probs": self.n_probs,
                "req_timeout": self.req_timeout,
                "ready_timeout": self.ready_timeout,
                "max_footprint_gb": self.max_footprint_gb,
                "cache_passes": self.cache_passes,
                "cache_ram": self.cache_ram,
                "cache_shape": self.cache_shape,
            }
        )

    def check(self) -> None:
        """The cheap checks, all in one place and before any file, profile code or server is
        touched: the engine's name, required values, the numbers, the gate policy, a work-set
        source, the profile-only options without a profile (so a typo cannot silently do
        nothing) and the out-dir."""
        engine_for(self.engine)
        if self.ctx is None or self.parallel is None:
            raise UsageError("--ctx and --parallel are required (tokens per slot, and N)")
        problems = self.number_problems() + policy_usage_problems(self.policy())
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
        if self.out_dir is None:
            raise UsageError("--out-dir DIR is required (where the cert and server logs go)")

    def policy(self) -> GatePolicy:
        """The gate policy the request asks for (F4 always armed, at ``logit_eps``)."""
        return GatePolicy(
            min_hot_trials=self.min_hot_trials,
            logit_eps=self.logit_eps,
            min_answer_tokens=self.min_answer_tokens,
            max_bound=self.max_bound,
        )
