"""The ``--engine`` names and the adapter behind each."""

from __future__ import annotations

from collections.abc import Mapping

from batch_invariance.engines.base import Engine
from batch_invariance.engines.llama_cpp_python import LlamaCppPythonEngine
from batch_invariance.engines.llama_server.engine import LlamaServerEngine
from batch_invariance.engines.sglang import SglangEngine
from batch_invariance.engines.vllm import VllmEngine
from batch_invariance.errors import UsageError

__all__ = ["DEFAULT_ENGINE", "ENGINES", "engine_for", "shown_name"]

DEFAULT_ENGINE = "llama-server"

ENGINES: Mapping[str, Engine] = {
    e.name: e for e in (LlamaServerEngine(), LlamaCppPythonEngine(), VllmEngine(), SglangEngine())
}


def engine_for(name: str) -> Engine:
    """The adapter for ``name``; :class:`UsageError` naming the choices otherwise."""
    try:
        return ENGINES[name]
    except KeyError:
        raise UsageError(
            f"unknown --engine {name!r}; choose one of {', '.join(sorted(ENGINES))}"
        ) from None


def shown_name(engine: Engine) -> str:
    """The engine's name where human-facing text names it: empty for the default engine,
    which plain output leaves unnamed."""
    return "" if engine.name == DEFAULT_ENGINE else engine.name
