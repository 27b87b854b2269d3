"""Where a profile's model registry is, and what an alias names in it (the registry's
reader is :mod:`batch_invariance.profiles.models`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from batch_invariance.errors import UsageError
from batch_invariance.profiles.loader import Profile
from batch_invariance.profiles.models import ResolvedModel, read_registry, resolve_model

__all__ = ["find_models_toml", "registry_model"]


def find_models_toml(profile: Profile, explicit: str | None, cwd: Path) -> Path:
    """Where the model registry is: ``explicit``, else ``./models.toml``, else the profile's
    own ``models.toml``. None of them is a :class:`UsageError` saying what to copy where."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise UsageError(f"--models-file {path}: no such file")
        return path
    for candidate in (cwd / "models.toml", profile.root / "models.toml"):
        if candidate.is_file():
            return candidate
    raise UsageError(
        f"no models.toml for --model-alias: copy {profile.models_example} to ./models.toml, "
        "edit it, and rerun (or pass --models-file PATH, or --model GGUF instead)"
    )


def registry_model(
    profile: Profile,
    alias: str,
    models_dir: str | None,
    *,
    models_file: str | None,
    model_override: str | None,
    env: Mapping[str, str],
    cwd: Path,
) -> tuple[ResolvedModel, Path]:
    """What ``alias`` names in the profile's registry, and the registry file it was read from.
    ``models_dir`` falls back to ``env["MODELS_DIR"]``."""
    path = find_models_toml(profile, models_file, cwd)
    resolved = resolve_model(
        read_registry(path),
        alias,
        models_dir or env.get("MODELS_DIR"),
        model_override=model_override,
    )
    return resolved, path
