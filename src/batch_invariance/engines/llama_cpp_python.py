"""llama-cpp-python's server (``python -m llama_cpp.server``): the negative control.

It serves every request on one llama.cpp context behind a lock, so it never co-batches and has
no ``/slots`` or busy gauge to show otherwise. A correct verifier therefore never certifies it
GREEN (no server-side co-batching witness: F1 fails closed, UNVERIFIED) and, since the arms are
computed one at a time on the same context size, should not see RED either.
``server_bin`` is the Python interpreter that has ``llama-cpp-python[server]`` installed.
"""

from __future__ import annotations

from typing import Any

from batch_invariance.engines.base import Engine, LaunchCommand, LaunchRequest

#: Ready when the OpenAI model list answers (the server has no ``/health``).
READY_PATH = "/v1/models"


class LlamaCppPythonEngine(Engine):
    """``python -m llama_cpp.server --model M --n_ctx C --host 127.0.0.1 --port P``."""

    name = "llama-cpp-python"
    cobatches = False
    #: Its ``--model`` is one GGUF file (header read, memory guard applied).
    loads_gguf = True
    owned_flags: frozenset[str] = frozenset({"--model", "--n_ctx", "--host", "--port"})
    #: ``--cache`` turns on its prompt cache; a config file could set anything.
    #: What turns its prompt cache off in a deploy (a verdict's reason words the fix).
    cache_off_advice = "no --cache"
    refused_flags: frozenset[str] = frozenset({"--cache", "--config_file"})
    #: No parallel flag: it serves one request at a time whatever N is.
    argv_names = ("--model", None, "--n_ctx")

    def launch_command(self, r: LaunchRequest) -> LaunchCommand:
        # ``parallel`` has no flag here: the server runs one request at a time whatever N is.
        argv = (
            str(r.server_bin), "-m", "llama_cpp.server", "--model", str(r.model),
            "--n_ctx", str(r.ctx), "--host", r.host, "--port", str(r.port), *r.extra_flags,
        )  # fmt: skip
        return LaunchCommand(argv, {}, READY_PATH)

    def provenance(self, command: LaunchCommand) -> dict[str, Any]:
        return {
            "engine": self.name,
            "busy_witness": None,
            "cobatches": False,
            "note": "serves one request at a time; no server-side co-batching witness",
        }
