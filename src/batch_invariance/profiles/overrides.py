"""A profile's contribution to one run, with the command line's values taking precedence.

Explicit command-line values always beat the profile: :func:`resolve_profile_run` takes them
as ``cli_overrides`` and only fills what the command line left unset. :class:`ProfileRun` is
the one profile input every entry point reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batch_invariance.cert.provenance import ProfileRecord
from batch_invariance.core.scoring import Scorer
from batch_invariance.errors import UsageError
from batch_invariance.profiles.loader import Profile, load_profile
from batch_invariance.profiles.models import ResolvedModel, kv_flags
from batch_invariance.profiles.registry import registry_model
from batch_invariance.profiles.tokens import TokenCounter
from batch_invariance.run.scorer_loader import load_scorer
from batch_invariance.run.workset import Workset

__all__ = ["ProfileRun", "resolve_profile_run"]


@dataclass(frozen=True)
class ProfileRun:
    """What a profile contributes to one run, after command-line values took precedence.

    ``server_bin`` and ``model`` are ``None`` when neither the command line nor the registry
    gave one (the caller decides whether that is an error). ``server_flags`` are the
    registry's flags (defaults, then the model's), then ``-ctk/-ctv kv``, then the command
    line's, so the command line wins where llama-server takes the last value.
    """

    profile: Profile
    model_alias: str | None
    server_bin: str | None
    model: str | None
    kv: str | None
    server_flags: tuple[str, ...]
    corner: str
    seed: int
    scorer: Scorer
    models_toml: str | None

    def build_workset(self, ctx: int, token_counter: TokenCounter) -> Workset:
        """The frozen work-set for ``ctx``, fitted with ``token_counter``."""
        return self.profile.workset(ctx, self.corner, self.seed, token_counter)

    @property
    def provenance(self) -> ProfileRecord:
        """``provenance.profile`` of a cell run under this profile."""
        return ProfileRecord.from_record(
            {
                "name": self.profile.name,
                "corner": self.corner,
                "seed": self.seed,
                "model_alias": self.model_alias,
                "models_toml": self.models_toml,
                "kv": self.kv,
            }
        )


def resolve_profile_run(
    profile: str,
    model_alias: str | None,
    models_dir: str | None,
    cli_overrides: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ProfileRun:
    """Load ``profile``, resolve ``model_alias`` in its registry and merge the command line.

    ``cli_overrides`` holds only what the user set explicitly (``None`` values are ignored):
    ``server_bin``, ``model``, ``kv``, ``server_flags`` (sequence), ``corner``, ``seed``,
    ``scorer`` (a ``--scorer`` spec), ``models_file``. ``models_dir`` falls back to
    ``env["MODELS_DIR"]``.
    """
    env = os.environ if env is None else env
    cwd = Path.cwd() if cwd is None else cwd
    cli = {k: v for k, v in (cli_overrides or {}).items() if v is not None}
    loaded = load_profile(profile)
    resolved: ResolvedModel | None = None
    models_toml: str | None = None
    if model_alias is not None:
        resolved, path = registry_model(
            loaded,
            model_alias,
            models_dir,
            models_file=cli.get("models_file"),
            model_override=None if cli.get("model") is None else str(cli["model"]),
            env=env,
            cwd=cwd,
        )
        models_toml = str(path)
    cli_flags: Sequence[str] = tuple(str(f) for f in cli.get("server_flags", ()))
    kv = cli.get("kv") or (resolved.kv if resolved else None)
    registry_flags = resolved.server_flags if resolved else ()
    corner = str(cli.get("corner") or loaded.default_corner)
    if loaded.corners and corner not in loaded.corners:
        raise UsageError(
            f"profile {loaded.name}: unknown --corner {corner!r}; "
            f"expected one of {', '.join(loaded.corners)}"
        )
    spec = cli.get("scorer")
    scorer = load_scorer(str(spec)) if spec else loaded.scorer()
    model = cli.get("model") or (str(resolved.model) if resolved else None)
    return ProfileRun(
        profile=loaded,
        model_alias=model_alias,
        server_bin=cli.get("server_bin") or (resolved.server_bin if resolved else None),
        model=None if model is None else str(model),
        kv=None if kv is None else str(kv),
        server_flags=tuple(registry_flags) + kv_flags(kv) + tuple(cli_flags),
        corner=corner,
        seed=int(cli.get("seed", loaded.default_seed)),
        scorer=scorer,
        models_toml=models_toml,
    )
