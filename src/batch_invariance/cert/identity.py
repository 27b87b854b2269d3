"""Does a cert's identity agree with its own provenance? (pure)

The digest is a plain sha256 anyone can recompute, so a relabelled cert (``source`` set to
``live``, ``ctx`` or ``dispatch_n`` edited, then rebuilt with :func:`rederive`) passes every
consistency check. What a rebuild cannot change without also rewriting the provenance is
checked here: the cell a cert claims must be the cell its recorded servers ran.

* ``source`` ``live`` needs a live run: a mock driver, mock knobs, a mock server argv or a
  mock KV label is never live, and a live cert must record the servers it started.
* ``model`` must be the recorded model file (its name without ``.gguf``, or the profile's
  model alias), with a sha256, and every server must have been started on that file.
* ``ctx`` (per slot), ``dispatch_n`` and the KV layout must be what the argv of the servers
  actually started say: A at ``--parallel 1``, BC at ``--parallel dispatch_n``, each with
  ``--ctx-size`` = ctx x parallel, and the layout flag the ``kv_label`` names.

This catches relabelling by accident or by a careless hand; it is not proof against forgery
(a forger rewrites the provenance too). Authenticity is the signature's job.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batch_invariance.cert.schema import Cert

MOCK_DRIVERS: frozenset[str] = frozenset({"run-mock"})
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MODEL_FLAGS = ("--model", "-m")
_CTX_FLAGS = ("--ctx-size", "-c")
_PARALLEL_FLAGS = ("--parallel", "-np")
_SPLIT_FLAGS = frozenset({"--no-kv-unified", "-no-kvu"})
_UNIFIED_FLAGS = frozenset({"--kv-unified", "-kvu"})
_ROLE_PARALLEL_IS_ONE = "A"
_ROLE_UNDER_TEST = "BC"


@dataclass(frozen=True)
class _EngineFlags:
    """How one engine's argv names the model, the parallel sequences and the context."""

    model: tuple[str, ...]
    parallel: tuple[str, ...]
    ctx: tuple[str, ...]
    #: llama-server's ``--ctx-size`` is the total over slots (ctx x parallel).
    ctx_is_total: bool = False
    kv_layout: bool = False
    #: The model is the argument after this word (``vllm serve MODEL``), not a flag's value.
    model_after: str | None = None

    def model_of(self, argv: Sequence[str]) -> str | None:
        if self.model_after is not None:  # positional: ``vllm serve MODEL``
            k = argv.index(self.model_after) if self.model_after in argv else -1
            return argv[k + 1] if 0 <= k < len(argv) - 1 else None
        return _flag(argv, self.model)


#: ``provenance.engine`` -> its flags (a cert without ``engine`` was run on llama-server).
#: llama-cpp-python has no parallel flag: it serves one request at a time whatever N is.
_ENGINES: Mapping[str, _EngineFlags] = {
    "llama-server": _EngineFlags(
        tuple(_MODEL_FLAGS), tuple(_PARALLEL_FLAGS), tuple(_CTX_FLAGS), True, True
    ),
    "llama-cpp-python": _EngineFlags(("--model",), (), ("--n_ctx",)),
    "vllm": _EngineFlags((), ("--max-num-seqs",), ("--max-model-len",), model_after="serve"),
    "sglang": _EngineFlags(("--model-path",), ("--max-running-requests",), ("--context-length",)),
}


def _engine_flags(cert: Cert) -> _EngineFlags | None:
    engine = cert.provenance.get("engine", "llama-server")
    return _ENGINES.get(engine) if isinstance(engine, str) else None


def _flag(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last occurrence of a flag (``--flag V`` or ``--flag=V``)."""
    value: str | None = None
    for k, arg in enumerate(argv):
        for name in names:
            if arg == name and k + 1 < len(argv):
                value = argv[k + 1]
            elif arg.startswith(name + "="):
                value = arg[len(name) + 1 :]
    return value


def _layout(argv: Sequence[str]) -> str | None:
    """``split`` / ``unified`` as the argv says, ``None`` when it leaves it to the server."""
    found: str | None = None
    for arg in argv:
        if arg in _SPLIT_FLAGS:
            found = "split"
        elif arg in _UNIFIED_FLAGS:
            found = "unified"
    return found


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _servers(provenance: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = provenance.get("servers")
    return [s for s in raw if isinstance(s, Mapping)] if isinstance(raw, list) else []


def _argv(server: Mapping[str, Any]) -> list[str] | None:
    argv = server.get("argv")
    if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
        return list(argv)
    return None


def mock_markers(cert: Cert) -> tuple[str, ...]:
    """What in the cert's provenance says the run was against the mock."""
    prov = cert.provenance
    found: list[str] = []
    driver = prov.get("driver")
    if isinstance(driver, str) and (driver in MOCK_DRIVERS or "mock" in driver):
        found.append(f"driver {driver}")
    if "mock_knobs" in prov:
        found.append("mock knobs")
    for server in _servers(prov):
        argv = _argv(server) or []
        info = server.get("info")
        if (argv and "mock" in argv[0].rsplit("/", 1)[-1]) or (
            isinstance(info, Mapping) and info.get("kind") == "mock"
        ):
            found.append("a mock server argv")
            break
    if cert.kv_label.startswith("mock:"):
        found.append(f"KV label {cert.kv_label}")
    return tuple(found)


def _source_problems(cert: Cert) -> list[str]:
    markers = mock_markers(cert)
    if markers:
        return [
            f"source says live but its provenance records a mock run ({', '.join(markers)}): "
            "a mock run is never live"
        ]
    if not any(_argv(s) for s in _servers(cert.provenance)):
        return ["source says live but the provenance records no server argv"]
    return []


def _model_problems(cert: Cert) -> list[str]:
    model_file = cert.provenance.get("model_file")
    if not isinstance(model_file, Mapping):
        return [f"model {cert.model} but the provenance records no model file"]
    path, name, sha = model_file.get("path"), model_file.get("name"), model_file.get("sha256")
    problems: list[str] = []
    if not isinstance(sha, str) or not _SHA256.match(sha):
        problems.append(f"model {cert.model} but no sha256 of the model file is recorded")
    if not isinstance(path, str) or not isinstance(name, str) or path.rsplit("/", 1)[-1] != name:
        problems.append(f"model file name {name!r} is not the file of path {path!r}")
        return problems
    profile = cert.provenance.get("profile")
    alias = profile.get("model_alias") if isinstance(profile, Mapping) else None
    if cert.model not in {name.removesuffix(".gguf"), alias}:
        problems.append(f"model {cert.model} but the model file recorded is {name}")
    flags = _engine_flags(cert) or _ENGINES["llama-server"]
    for server in _servers(cert.provenance):
        served = flags.model_of(_argv(server) or [])
        if served != path:
            problems.append(f"server {server.get('role')} was started on {served}, not {path}")
    return problems


def _server_problems(cert: Cert) -> list[str]:
    flags = _engine_flags(cert)
    if flags is None:
        return [f"engine {cert.provenance.get('engine')!r} is not one this tool launches"]
    problems: list[str] = []
    claimed_layout = cert.kv_label.split(":", 1)[0]
    roles: list[str] = []
    for server in _servers(cert.provenance):
        role = str(server.get("role"))
        roles.append(role)
        argv = _argv(server) or []
        ctx_size = _int(_flag(argv, flags.ctx))
        want = 1 if role == _ROLE_PARALLEL_IS_ONE else cert.dispatch_n
        # An engine without a parallel flag serves one sequence at a time, whatever N was.
        parallel = _int(_flag(argv, flags.parallel)) if flags.parallel else 1
        if role not in (_ROLE_PARALLEL_IS_ONE, _ROLE_UNDER_TEST):
            problems.append(f"a server with unknown role {role!r} is recorded")
            continue
        if not flags.parallel:
            if ctx_size != cert.ctx:
                problems.append(f"ctx {cert.ctx} but server {role} ran a context of {ctx_size}")
            continue
        if parallel != want:
            problems.append(
                f"dispatch_n {cert.dispatch_n} but server {role} ran --parallel {parallel} "
                f"(expected {want})"
            )
        expected_ctx = cert.ctx * parallel if flags.ctx_is_total and parallel else cert.ctx
        if parallel and ctx_size != expected_ctx:
            problems.append(
                f"ctx {cert.ctx} per slot but server {role} ran --ctx-size {ctx_size} for "
                f"{parallel} slot(s)"
            )
        layout = _layout(argv)
        if flags.kv_layout and role == _ROLE_UNDER_TEST and layout != claimed_layout:
            problems.append(
                f"KV layout {claimed_layout} (kv_label) but server {role} ran "
                f"{layout or 'the server default'}"
            )
    if _ROLE_UNDER_TEST not in roles:
        problems.append(f"no server under test ({_ROLE_UNDER_TEST}) is recorded")
    return problems


def identity_problems(cert: Cert) -> tuple[str, ...]:
    """Every way the cert's ``source``, ``model``, ``ctx``, ``dispatch_n`` and KV layout
    disagree with its own provenance. Empty = consistent. A mock cert claims nothing that
    could be promoted, so only a live one is checked."""
    if cert.source != "live":
        return ()
    source = _source_problems(cert)
    if source:
        return tuple(source)
    return tuple(_model_problems(cert) + _server_problems(cert))
