"""Loading a profile folder: its settings and its two entry points (``generate``,
``make_scorer``), imported as a package; every failure is a one-line :class:`UsageError`
naming the file (the folder's layout: :mod:`batch_invariance.profiles`)."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from batch_invariance.core.plan import WorkItem
from batch_invariance.core.scoring import Scorer
from batch_invariance.errors import BatchInvarianceError, UsageError
from batch_invariance.profiles.models import load_toml
from batch_invariance.profiles.tokens import TokenCounter, approx_token_count
from batch_invariance.run.workset import Workset, workset_from_items

__all__ = ["Profile", "bundled_profiles", "load_profile"]

#: The package bundled profiles are imported under.
_PACKAGE = "batch_invariance.profiles"
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
    return Path(str(resources.files(_PACKAGE)))


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
        qualified = f"{_PACKAGE}.{name}.{module}"
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
