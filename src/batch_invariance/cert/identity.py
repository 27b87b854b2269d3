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
from typing import NamedTuple

from batch_invariance.cert.provenance import DEFAULT_ENGINE_NAME
from batch_invariance.cert.schema import Cert
from batch_invariance.engines.llama_server.flags import FlagError, ServerFlags, read_flags

MOCK_DRIVERS: frozenset[str] = frozenset({"run-mock"})
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ROLE_PARALLEL_IS_ONE = "A"
_ROLE_UNDER_TEST = "BC"
#: The prompt-cache arm's server: --parallel N like BC, with the prompt cache on.
_ROLE_CACHE = "cache"


def _flags(argv: Sequence[str]) -> ServerFlags:
    """The recorded argv through the one llama-server flag reader; an argv it cannot read
    reads as no flags at all (every check below then fails, as it should)."""
    try:
        return read_flags(argv)
    except FlagError:
        return read_flags(())


def _layout(flags: ServerFlags) -> str | None:
    """``split`` / ``unified`` as the argv says, ``None`` when it leaves it to the server."""
    return None if flags.kv_unified is None else ("unified" if flags.kv_unified else "split")


@dataclass(frozen=True)
class _Launched:
    """What a recorded argv says was started, whatever the engine."""

    model: str | None
    parallel: int | None
    #: Context tokens per sequence.
    ctx: int | None
    #: ``split`` / ``unified`` for llama-server; other engines do not name a KV layout.
    layout: str | None = None
    checks_layout: bool = False
    #: The engine has no parallel flag: it serves one request at a time whatever N was.
    serves_one: bool = False
    #: How the argv said the context, for messages (``--ctx-size 2048``).
    ctx_said: str = ""


class _EngineFlags(NamedTuple):
    """The flags another engine's argv names its model, N and context with."""

    model: str
    #: ``None``: no parallel flag (it serves one request at a time whatever N is).
    parallel: str | None
    ctx: str


#: Other engines' flags, as ``engines/`` launches them.
_OTHER_ENGINES: Mapping[str, _EngineFlags] = {
    "llama-cpp-python": _EngineFlags("--model", None, "--n_ctx"),
    "vllm": _EngineFlags("--model", "--max-num-seqs", "--max-model-len"),
    "sglang": _EngineFlags("--model-path", "--max-running-requests", "--context-length"),
}


def _value_after(argv: Sequence[str], name: str) -> str | None:
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


def _launched(cert: Cert, argv: Sequence[str]) -> _Launched | None:
    """``None`` when ``provenance.engine`` names an engine this tool does not launch."""
    engine = cert.provenance.engine_name
    if engine == DEFAULT_ENGINE_NAME:
        flags = _flags(argv)
        per_slot = (
            flags.ctx_size // flags.parallel
            if flags.ctx_size is not None
            and flags.parallel
            and flags.ctx_size % flags.parallel == 0
            else None
        )
        said = f"--ctx-size {flags.ctx_size}"
        return _Launched(flags.model, flags.parallel, per_slot, _layout(flags), True, False, said)
    if engine not in _OTHER_ENGINES:
        return None
    flag = _OTHER_ENGINES[engine]
    parallel = 1 if flag.parallel is None else _as_int(_value_after(argv, flag.parallel))
    ctx_text = _value_after(argv, flag.ctx)
    return _Launched(
        _value_after(argv, flag.model),
        parallel,
        _as_int(ctx_text),
        serves_one=flag.parallel is None,
        ctx_said=f"{flag.ctx} {ctx_text}",
    )


def mock_markers(cert: Cert) -> tuple[str, ...]:
    """What in the cert's provenance says the run was against the mock."""
    prov = cert.provenance
    found: list[str] = []
    driver = prov.driver
    if driver is not None and (driver in MOCK_DRIVERS or "mock" in driver):
        found.append(f"driver {driver}")
    if prov.records_mock_knobs:
        found.append("mock knobs")
    for server in prov.server_entries:
        argv = server.argv or ()
        if (argv and "mock" in argv[0].rsplit("/", 1)[-1]) or (
            server.info is not None and server.info.kind == "mock"
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
    if not any(s.argv for s in cert.provenance.server_entries):
        return ["source says live but the provenance records no server argv"]
    return []


def _model_problems(cert: Cert) -> list[str]:
    model_file = cert.provenance.model_file
    if model_file is None:
        return [f"model {cert.model} but the provenance records no model file"]
    path, name, sha = model_file.path, model_file.name, model_file.sha256
    problems: list[str] = []
    if sha is None or not _SHA256.match(sha):
        problems.append(f"model {cert.model} but no sha256 of the model file is recorded")
    if path is None or name is None or path.rsplit("/", 1)[-1] != name:
        problems.append(f"model file name {name!r} is not the file of path {path!r}")
        return problems
    profile = cert.provenance.profile
    alias = profile.model_alias if profile is not None else None
    if cert.model not in {name.removesuffix(".gguf"), alias}:
        problems.append(f"model {cert.model} but the model file recorded is {name}")
    for server in cert.provenance.server_entries:
        launched = _launched(cert, server.argv or ())
        served = launched.model if launched is not None else None
        if served != path:
            problems.append(f"server {server.role} was started on {served}, not {path}")
    return problems


def _server_problems(cert: Cert) -> list[str]:
    problems: list[str] = []
    claimed_layout = cert.kv_label.split(":", 1)[0]
    roles: list[str] = []
    for server in cert.provenance.server_entries:
        role = str(server.role)
        roles.append(role)
        launched = _launched(cert, server.argv or ())
        if launched is None:
            return [f"engine {cert.provenance.engine!r} is not one this tool launches"]
        parallel = launched.parallel
        want = 1 if role == _ROLE_PARALLEL_IS_ONE or launched.serves_one else cert.dispatch_n
        if role not in (_ROLE_PARALLEL_IS_ONE, _ROLE_UNDER_TEST, _ROLE_CACHE):
            problems.append(f"a server with unknown role {role!r} is recorded")
            continue
        if parallel != want:
            problems.append(
                f"dispatch_n {cert.dispatch_n} but server {role} ran --parallel {parallel} "
                f"(expected {want})"
            )
        if parallel and launched.ctx != cert.ctx:
            problems.append(
                f"ctx {cert.ctx} per slot but server {role} ran {launched.ctx_said} for "
                f"{parallel} slot(s)"
            )
        layout = launched.layout
        under_test = role in (_ROLE_UNDER_TEST, _ROLE_CACHE)
        if launched.checks_layout and under_test and layout != claimed_layout:
            problems.append(
                f"KV layout {claimed_layout} (kv_label) but server {role} ran "
                f"{layout or 'the server default'}"
            )
    if _ROLE_UNDER_TEST not in roles:
        problems.append(f"no server under test ({_ROLE_UNDER_TEST}) is recorded")
    measured_cache = cert.prompt_cache is not None
    if measured_cache != (_ROLE_CACHE in roles):
        problems.append(
            "a prompt_cache block but no prompt-cache server (role cache) is recorded"
            if measured_cache
            else "a prompt-cache server (role cache) is recorded but no prompt_cache block"
        )
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
