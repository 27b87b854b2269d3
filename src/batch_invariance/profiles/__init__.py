"""Measurement profiles: everything model- and task-specific for one kind of workload.

A profile is a folder. Bundled ones live here (``batch_invariance/profiles/<name>/``);
``--profile`` also accepts the path of a user's own folder with the same layout::

    <profile>/
      profile.toml          [profile] name, description
                            [workset] corners = [...], default_corner, default_seed
      workset.py            generate(ctx, corner, seed, token_counter) -> list[WorkItem]
      scorer.py             make_scorer() -> batch_invariance.core.scoring.Scorer
      models.example.toml   the model registry template (see profiles.models)
      models.toml           optional: the user's copy (also looked for in the current folder)

``generate`` must be deterministic and take the number of tokens of a text from
``token_counter`` (``profiles.tokens``); it may raise :class:`UsageError` for bad arguments.
The two modules are imported as a package, so they may import siblings with relative imports.
Anything that goes wrong while loading or running them is a one-line :class:`UsageError`
naming the file; an :class:`InfraError` (a failed ``/tokenize``) passes through as it is.

Explicit command-line values always beat the profile: ``resolve_profile_run`` takes them as
``cli_overrides`` and only fills what the command line left unset.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from batch_invariance.core.scoring import Scorer
from batch_invariance.core.workitem import WorkItem
from batch_invariance.errors import BatchInvarianceError, UsageError
from batch_invariance.profiles.models import (
    Registry,
    ResolvedModel,
    kv_flags,
    load_toml,
    read_registry,
    resolve_model,
)
from batch_invariance.profiles.tokens import TokenCounter, approx_token_count
from batch_invariance.run.scorer_loader import load_scorer
from batch_invariance.run.workset import Workset, workset_from_items

__all__ = [
    "Profile",
    "ProfileRun",
    "TokenCounter",
    "approx_token_count",
    "bundled_profiles",
    "find_models_toml",
    "load_profile",
    "resolve_profile_run",
]

_REQUIRED_FILES = ("profile.toml", "workset.py", "scorer.py")
_GENERATE = "generate"
_MAKE_SCORER = "make_scorer"


@dataclass(frozen=True)
class Profile:
    """A loaded profile: its folder, settings and the two entry points."""

    name: str
    root: Path
    bundled: bool
    description: str
    corners: tuple[str, ...]
    default_corner: str
    default_seed: int
    generate_fn: Callable[..., Any] = field(repr=False)
    make_scorer_fn: Callable[[], Any] = field(repr=False)

    @property
    def workset_file(self) -> Path:
        return self.root / "workset.py"

    @property
    def scorer_file(self) -> Path:
        return self.root / "scorer.py"

    @property
    def models_example(self) -> Path:
        return self.root / "models.example.toml"

    def scorer(self) -> Scorer:
        """A fresh scorer from ``make_scorer()``; failures name ``scorer.py``."""
        try:
            made = self.make_scorer_fn()
        except BatchInvarianceError:
            raise
        except Exception as exc:
            raise UsageError(
                f"profile {self.name}: {self.scorer_file}: make_scorer() failed: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(made, Scorer):
            raise UsageError(
                f"profile {self.name}: {self.scorer_file}: make_scorer() returned "
                f"{type(made).__name__}, not a batch_invariance Scorer"
            )
        return made

    def _corner_or_default(self, corner: str | None) -> str:
        return corner or self.default_corner

    def _seed_or_default(self, seed: int | None) -> int:
        return self.default_seed if seed is None else seed

    def generate(
        self,
        ctx: int,
        corner: str | None = None,
        seed: int | None = None,
        token_counter: TokenCounter = approx_token_count,
        notes: list[str] | None = None,
    ) -> list[WorkItem]:
        """Run the profile's ``generate``; check it returned unique :class:`WorkItem`s.

        When ``generate`` accepts a ``skipped`` keyword (a list it appends to), what it left
        out is added to ``notes``.
        """
        corner, seed = self._corner_or_default(corner), self._seed_or_default(seed)
        if self.corners and corner not in self.corners:
            raise UsageError(
                f"profile {self.name}: unknown --corner {corner!r}; "
                f"expected one of {', '.join(self.corners)}"
            )
        extra: dict[str, Any] = {}
        if notes is not None and "skipped" in inspect.signature(self.generate_fn).parameters:
            extra["skipped"] = notes
        try:
            items = self.generate_fn(ctx, corner, seed, token_counter, **extra)
        except BatchInvarianceError:
            raise
        except Exception as exc:
            raise UsageError(
                f"profile {self.name}: {self.workset_file}: generate() failed: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(items, (list, tuple)) or not items:
            raise UsageError(
                f"profile {self.name}: {self.workset_file}: generate() must return a "
                "non-empty list of WorkItem"
            )
        seen: set[str] = set()
        for item in items:
            if not isinstance(item, WorkItem):
                raise UsageError(
                    f"profile {self.name}: {self.workset_file}: generate() returned a "
                    f"{type(item).__name__}, expected WorkItem"
                )
            if item.test_id in seen:
                raise UsageError(
                    f"profile {self.name}: {self.workset_file}: duplicate id {item.test_id!r}"
                )
            seen.add(item.test_id)
        return list(items)

    def workset(
        self,
        ctx: int,
        corner: str | None = None,
        seed: int | None = None,
        token_counter: TokenCounter = approx_token_count,
        notes: list[str] | None = None,
    ) -> Workset:
        """:meth:`generate` as a hashed :class:`Workset`."""
        corner, seed = self._corner_or_default(corner), self._seed_or_default(seed)
        items = self.generate(ctx, corner, seed, token_counter, notes)
        return workset_from_items(
            items, source=f"profile {self.name} (ctx {ctx}, corner {corner}, seed {seed})"
        )


def _bundled_root() -> Path:
    return Path(str(resources.files(__name__)))


def bundled_profiles() -> tuple[str, ...]:
    """Names of the profiles shipped with the package."""
    root = _bundled_root()
    return tuple(
        sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "profile.toml").is_file())
    )


def _locate(profile: str) -> tuple[Path, bool]:
    looks_like_path = os.sep in profile or "/" in profile or profile.startswith(".")
    if not looks_like_path and profile in bundled_profiles():
        return _bundled_root() / profile, True
    path = Path(profile).expanduser()
    if path.is_dir():
        return path.resolve(), False
    known = ", ".join(bundled_profiles()) or "(none)"
    raise UsageError(
        f"--profile {profile!r}: no bundled profile of that name (bundled: {known}) and no "
        "such folder; pass a bundled name or the path of a profile folder"
    )


def _read_profile_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None
    return load_toml(text, str(path))


def _table(data: Mapping[str, Any], key: str, path: Path) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise UsageError(f"{path}: [{key}] must be a table")
    return value


def _import_module(root: Path, bundled: bool, name: str, module: str) -> types.ModuleType:
    file = root / f"{module}.py"
    if bundled:
        qualified = f"{__name__}.{name}.{module}"
    else:
        # A synthetic package for the user's folder so that relative imports work.
        digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
        package = f"_bi_profile_{digest}"
        if package not in sys.modules:
            pkg = types.ModuleType(package)
            pkg.__path__ = [str(root)]
            sys.modules[package] = pkg
        qualified = f"{package}.{module}"
    try:
        return importlib.import_module(qualified)
    except Exception as exc:
        raise UsageError(
            f"profile {name}: loading {file} failed: {type(exc).__name__}: {exc}"
        ) from None


def _entry_point(module: types.ModuleType, attr: str, file: Path, name: str) -> Callable[..., Any]:
    target = getattr(module, attr, None)
    if not callable(target):
        raise UsageError(f"profile {name}: {file} must define a function {attr}()")
    return target  # type: ignore[no-any-return]


def load_profile(profile: str) -> Profile:
    """Load a bundled profile by name, or a profile folder by path."""
    root, bundled = _locate(profile)
    missing = [f for f in _REQUIRED_FILES if not (root / f).is_file()]
    if missing:
        raise UsageError(
            f"profile folder {root} lacks {', '.join(missing)}; a profile needs "
            f"{', '.join(_REQUIRED_FILES)} (see batch_invariance.profiles)"
        )
    toml_path = root / "profile.toml"
    data = _read_profile_toml(toml_path)
    head = _table(data, "profile", toml_path)
    ws = _table(data, "workset", toml_path)
    name = str(head.get("name", root.name))
    corners = tuple(str(c) for c in ws.get("corners", ()))
    default_corner = str(ws.get("default_corner", corners[0] if corners else "default"))
    default_seed = ws.get("default_seed", 0)
    if not isinstance(default_seed, int) or isinstance(default_seed, bool):
        raise UsageError(f"{toml_path}: [workset] default_seed must be an integer")
    workset_module = _import_module(root, bundled, name, "workset")
    scorer_module = _import_module(root, bundled, name, "scorer")
    return Profile(
        name=name,
        root=root,
        bundled=bundled,
        description=str(head.get("description", "")),
        corners=corners,
        default_corner=default_corner,
        default_seed=default_seed,
        generate_fn=_entry_point(workset_module, _GENERATE, root / "workset.py", name),
        make_scorer_fn=_entry_point(scorer_module, _MAKE_SCORER, root / "scorer.py", name),
    )


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
        path = find_models_toml(loaded, cli.get("models_file"), cwd)
        registry: Registry = read_registry(path)
        models_toml = str(path)
        resolved = resolve_model(
            registry,
            model_alias,
            models_dir or env.get("MODELS_DIR"),
            model_override=None if cli.get("model") is None else str(cli["model"]),
        )
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
