"""What a recorded server argv says was started, whatever the engine (pure).

The cert's identity check (:mod:`batch_invariance.cert.identity`) holds a cert's claimed
cell against the argv of the servers it records; each engine reads its own argv
(:meth:`batch_invariance.engines.base.Engine.recorded_launch`) into a :class:`RecordedLaunch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RecordedLaunch", "value_after"]


def value_after(argv: Sequence[str], name: str) -> str | None:
    """The value of the last ``name V`` or ``name=V``."""
    value: str | None = None
    for k, arg in enumerate(argv):
        if arg == name and k + 1 < len(argv):
            value = argv[k + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1 :]
    return value


def _as_int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


@dataclass(frozen=True)
class RecordedLaunch:
    """What a recorded argv says was started."""

    model: str | None
    parallel: int | None
    #: Context tokens per sequence.
    ctx: int | None
    #: ``split`` / ``unified`` where the engine's argv names a KV layout.
    layout: str | None = None
    #: Whether the argv names the KV layout at all (then it is checked).
    checks_layout: bool = False
    #: The engine has no parallel flag: it serves one request at a time whatever N was.
    serves_one: bool = False
    #: How the argv said the context, for messages (``--ctx-size 2048``).
    ctx_said: str = ""

    @classmethod
    def read(
        cls, argv: Sequence[str], model: str, parallel: str | None, ctx: str
    ) -> RecordedLaunch:
        """An argv whose model, N and context (per sequence) are each one flag's value;
        ``parallel`` ``None``: the engine has no such flag and serves one request at a time."""
        ctx_text = value_after(argv, ctx)
        return cls(
            value_after(argv, model),
            1 if parallel is None else _as_int(value_after(argv, parallel)),
            _as_int(ctx_text),
            serves_one=parallel is None,
            ctx_said=f"{ctx} {ctx_text}",
        )
