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
from collections.abc import Callable, Sequence

from batch_invariance.cert.schema import Cert
from batch_invariance.core.roles import ServerRole
from batch_invariance.engines.recorded import RecordedLaunch

__all__ = ["MOCK_DRIVERS", "LaunchReader", "identity_problems", "mock_markers"]

MOCK_DRIVERS: frozenset[str] = frozenset({"run-mock"})
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ROLES = {role.value: role for role in ServerRole}

#: What a recorded argv of the named engine says was started; ``None`` for an engine this
#: tool does not launch (:func:`batch_invariance.engines.registry.recorded_launch`, each
#: engine reading its own argv).
LaunchReader = Callable[[str, Sequence[str]], RecordedLaunch | None]


def _launched(cert: Cert, argv: Sequence[str], read: LaunchReader) -> RecordedLaunch | None:
    """``None`` when ``provenance.engine`` names an engine this tool does not launch."""
    return read(cert.provenance.engine_name, argv)


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


def _model_problems(cert: Cert, read: LaunchReader) -> list[str]:
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
        launched = _launched(cert, server.argv or (), read)
        served = launched.model if launched is not None else None
        if served != path:
            problems.append(f"server {server.role} was started on {served}, not {path}")
    return problems


def _server_problems(cert: Cert, read: LaunchReader) -> list[str]:
    problems: list[str] = []
    claimed_layout = cert.kv_label.split(":", 1)[0]
    roles: list[str] = []
    for server in cert.provenance.server_entries:
        role = str(server.role)
        roles.append(role)
        launched = _launched(cert, server.argv or (), read)
        if launched is None:
            return [f"engine {cert.provenance.engine!r} is not one this tool launches"]
        parallel = launched.parallel
        known = _ROLES.get(role)
        want = 1 if known is ServerRole.A or launched.serves_one else cert.dispatch_n
        if known is None:
            problems.append(f"a server with unknown role {role!r} is recorded")
            continue
        if parallel != want:
            problems.append(
                f"dispatch_n {cert.dispatch_n} but server {role} ran --parallel {parallel} "
                f"(expected {want})"
            )
        # A unified pool's A holds the whole pool on its one slot (any slot of the pool may
        # fill it); a cert written before that ran A on the pool's share.
        pool = cert.ctx * cert.dispatch_n if claimed_layout == "unified" else cert.ctx
        allowed = {cert.ctx, pool} if known is ServerRole.A else {cert.ctx}
        if parallel and launched.ctx not in allowed:
            problems.append(
                f"ctx {cert.ctx} per slot but server {role} ran {launched.ctx_said} for "
                f"{parallel} slot(s)"
            )
        layout = launched.layout
        if launched.checks_layout and known.under_test and layout != claimed_layout:
            problems.append(
                f"KV layout {claimed_layout} (kv_label) but server {role} ran "
                f"{layout or 'the server default'}"
            )
    if ServerRole.BC.value not in roles:
        problems.append(f"no server under test ({ServerRole.BC.value}) is recorded")
    measured_cache = cert.prompt_cache is not None
    if measured_cache != (ServerRole.CACHE.value in roles):
        problems.append(
            "a prompt_cache block but no prompt-cache server (role cache) is recorded"
            if measured_cache
            else "a prompt-cache server (role cache) is recorded but no prompt_cache block"
        )
    return problems


def identity_problems(cert: Cert, read: LaunchReader) -> tuple[str, ...]:
    """Every way the cert's ``source``, ``model``, ``ctx``, ``dispatch_n`` and KV layout
    disagree with its own provenance, each server's argv read by ``read``. Empty =
    consistent. A mock cert claims nothing that could be promoted, so only a live one is
    checked."""
    if cert.source != "live":
        return ()
    source = _source_problems(cert)
    if source:
        return tuple(source)
    return tuple(_model_problems(cert, read) + _server_problems(cert, read))
