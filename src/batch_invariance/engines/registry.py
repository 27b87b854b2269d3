"""The ``--engine`` names and the adapter behind each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from batch_invariance.engines.base import Engine
from batch_invariance.engines.llama_cpp_python import LlamaCppPythonEngine
from batch_invariance.engines.llama_server.engine import LlamaServerEngine
from batch_invariance.engines.llama_server.env import LLAMA_CPP_ENV
from batch_invariance.engines.recorded import RecordedLaunch
from batch_invariance.engines.sglang import SglangEngine
from batch_invariance.engines.vllm import VllmEngine
from batch_invariance.errors import UsageError

__all__ = ["DEFAULT_ENGINE", "ENGINES", "default_engine", "engine_for", "recorded_launch",
           "shown_name"]  # fmt: skip

DEFAULT_ENGINE = "llama-server"

#: Every engine's server child gets llama.cpp's variables (ggml's, and the CUDA, OpenMP and
#: BLAS runtimes' that the Python engines load too), as it always has.
ENGINES: Mapping[str, Engine] = {
    e.name: e
    for e in (
        LlamaServerEngine(),
        LlamaCppPythonEngine(env_rules=LLAMA_CPP_ENV),
        VllmEngine(env_rules=LLAMA_CPP_ENV),
        SglangEngine(env_rules=LLAMA_CPP_ENV),
    )
}


def engine_for(name: str) -> Engine:
    """The adapter for ``name``; :class:`UsageError` naming the choices otherwise."""
    try:
        return ENGINES[name]
    except KeyError:
        raise UsageError(
            f"unknown --engine {name!r}; choose one of {', '.join(sorted(ENGINES))}"
        ) from None


def default_engine() -> Engine:
    """The adapter of the default engine (llama-server)."""
    return ENGINES[DEFAULT_ENGINE]


def recorded_launch(engine: str, argv: Sequence[str]) -> RecordedLaunch | None:
    """What ``argv`` says the engine a cert names started; ``None`` for an engine this tool
    does not launch (or whose argv it does not read)."""
    found = ENGINES.get(engine)
    return None if found is None else found.recorded_launch(argv)


def shown_name(engine: Engine) -> str:
    """The engine's name where human-facing text names it: empty for the default engine,
    which plain output leaves unnamed."""
    return "" if engine.name == DEFAULT_ENGINE else engine.name
