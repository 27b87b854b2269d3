"""Loading a user's scorer from ``pkg.mod:NAME`` or ``file.py:NAME`` (``--scorer``)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batch_invariance.core.scoring import ExactMatchScorer, FunctionScorer, Scorer, one_line
from batch_invariance.errors import UsageError

__all__ = ["load_scorer"]


def _check_function_signature(fn: Callable[..., Any], spec: str, name: str) -> None:
    """Refuse, before any server starts, a function that cannot take ``(text, expected, *, item)``.

    Otherwise every trial would become ``scorer_error`` and the run would be wasted.
    Callables without an introspectable signature (some builtins) are accepted as they are.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind("", None, item=None)
    except TypeError as exc:
        raise UsageError(
            f"--scorer {spec!r}: {name}{sig} cannot be called as fn(text, expected, *, item) "
            f"({exc})"
        ) from None


def _import_target(module_part: str) -> Any:
    if module_part.endswith(".py") or "/" in module_part:
        path = Path(module_part)
        if not path.is_file():
            raise UsageError(f"--scorer: no such file {path}")
        name = f"_bi_scorer_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"--scorer: cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(module_part)


def load_scorer(spec: str | None) -> Scorer:
    """Load ``pkg.mod:NAME`` or ``file.py:NAME``; ``None`` gives :class:`ExactMatchScorer`.

    NAME may be a :class:`Scorer` subclass (instantiated with no arguments), an instance, or a
    plain function. Anything else is a :class:`UsageError` with one line.
    """
    if spec is None:
        return ExactMatchScorer()
    module_part, sep, name = spec.rpartition(":")
    if not sep or not module_part or not name:
        raise UsageError(f"--scorer {spec!r}: expected 'pkg.module:NAME' or 'file.py:NAME'")
    try:
        module = _import_target(module_part)
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(
            f"--scorer {spec!r}: importing {module_part} failed: {one_line(exc)}"
        ) from None
    try:
        target = getattr(module, name)
    except AttributeError:
        raise UsageError(f"--scorer {spec!r}: {module_part} has no attribute {name!r}") from None
    if inspect.isclass(target):
        if not issubclass(target, Scorer):
            raise UsageError(f"--scorer {spec!r}: class {name} is not a batch_invariance Scorer")
        try:
            instance = target()
        except Exception as exc:
            raise UsageError(f"--scorer {spec!r}: {name}() failed: {one_line(exc)}") from None
        if instance.scorer_id == Scorer.scorer_id:
            instance.scorer_id = spec
        return instance
    if isinstance(target, Scorer):
        return target
    if callable(target):
        _check_function_signature(target, spec, name)
        return FunctionScorer(target, scorer_id=spec)
    raise UsageError(f"--scorer {spec!r}: {name} is neither a Scorer nor a function")
