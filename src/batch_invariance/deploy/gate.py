"""The deploy gate: which (model, ctx, N) cells a deploy config runs, and whether each is certified.

A deploy config is either a file holding ``llama-server`` command line(s) (a shell script, a
systemd ``ExecStart=`` line, a compose ``command:`` string...) or a ``models.toml``-style file
(``[defaults]`` + ``[[models]]`` with ``gguf``, ``alias`` and ``server_flags``). From it we
derive the cells the server would run, with llama-server's own defaults where a flag is absent:

* ``-c/--ctx-size`` defaults to 0, "the context the model was trained with" (read from the
  GGUF header when the file is reachable);
* ``-np/--parallel`` defaults to -1, "auto", which llama-server turns into 4 slots with a
  unified KV cache;
* the context a slot gets is ``ctx-size / parallel`` unless the KV cache is unified
  (``-kvu``), in which case every slot may use the whole ``ctx-size``.

The cell's ``ctx`` is that per-slot context, because that is what a cert's ``ctx`` means
(every slot of the B/C server gets C tokens). Every cell with ``parallel > 1`` needs a cert in
the certs folder that verifies (schema, digest, re-derived verdict), is promotable and, when
asked, carries a valid sigstore bundle for the given identity. Parsing is pure; only
:func:`load_deploy_config` and :func:`check_cells` touch files.
"""

from __future__ import annotations

import importlib
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from batch_invariance.errors import CertInvalid, UsageError

#: llama-server's defaults for the flags we read (see its --help).
DEFAULT_CTX_SIZE = 0
DEFAULT_PARALLEL = -1
AUTO_PARALLEL_SLOTS = 4

_MODEL_FLAGS = frozenset({"-m", "--model"})
_HF_FLAGS = frozenset({"-hf", "-hfr", "--hf-repo"})
_CTX_FLAGS = frozenset({"-c", "--ctx-size"})
_PARALLEL_FLAGS = frozenset({"-np", "--parallel"})
_CACHE_K_FLAGS = frozenset({"-ctk", "--cache-type-k"})
_CACHE_V_FLAGS = frozenset({"-ctv", "--cache-type-v"})
#: llama-server's KV cache type when none is given.
DEFAULT_CACHE_TYPE = "f16"
_KVU_ON = frozenset({"-kvu", "--kv-unified"})
_KVU_OFF = frozenset({"-no-kvu", "--no-kv-unified"})
_ENV_KEYS = {
    "LLAMA_ARG_MODEL": "model",
    "LLAMA_ARG_CTX_SIZE": "ctx",
    "LLAMA_ARG_N_PARALLEL": "parallel",
    "LLAMA_ARG_KV_UNIFIED": "kvu",
    "LLAMA_ARG_CACHE_TYPE_K": "cache_k",
    "LLAMA_ARG_CACHE_TYPE_V": "cache_v",
}

CheckKind = Literal["ok", "missing", "not_promotable", "invalid", "unknown_ctx"]


@dataclass(frozen=True)
class DeployCell:
    """One server the deploy config would start, as the cell it runs."""

    #: Where it came from, for messages (``deploy.sh:3``, ``models.toml [gemma]``).
    origin: str
    #: The model as written (path, ``{MODELS_DIR}/x.gguf``, or an HF repo).
    model: str
    #: Names a cert's ``model`` field may use for it (file stem, alias).
    names: tuple[str, ...]
    #: ``-c`` as configured (0 = the model's training context).
    ctx_size: int
    #: Slots the server runs (auto resolved to llama-server's 4).
    parallel: int
    kv_unified: bool
    #: Context per slot, the cert's ``ctx``; None when it cannot be known from the config.
    ctx: int | None
    #: KV cache types (K, V): a cert measured with other types does not cover this cell.
    kv_types: tuple[str, str] = (DEFAULT_CACHE_TYPE, DEFAULT_CACHE_TYPE)

    @property
    def label(self) -> str:
        ctx = "?" if self.ctx is None else str(self.ctx)
        return f"{self.names[0]} ctx={ctx} N={self.parallel}"

    @property
    def needs_cert(self) -> bool:
        return self.parallel > 1


@dataclass(frozen=True)
class BundlePolicy:
    """The sigstore identity a cert's bundle must carry."""

    identity: str
    issuer: str
    repository: str | None = None
    offline: bool = False


@dataclass(frozen=True)
class CellCheck:
    cell: DeployCell
    kind: CheckKind
    reason: str
    cert: Path | None = None

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


@dataclass(frozen=True)
class DeployReport:
    config: Path
    checks: tuple[CellCheck, ...]
    #: Cells with parallel <= 1: nothing to certify.
    serial: tuple[DeployCell, ...]

    @property
    def passed(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failing(self) -> tuple[CellCheck, ...]:
        return tuple(check for check in self.checks if not check.ok)


def _toml_module() -> Any:
    """tomllib (3.11+) or its backport tomli (3.10), loaded by name so both type-check."""
    try:
        return importlib.import_module("tomllib")
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        return importlib.import_module("tomli")


def model_key(name: str) -> str:
    """A model's comparable name: its last path part without ``.gguf``."""
    base = name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    if base.lower().endswith(".gguf"):
        base = base[: -len(".gguf")]
    return base


def _int_value(flag: str, value: str, origin: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{origin}: {flag} needs an integer, got {value!r}") from None


def _truthy(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "on", "yes", "enabled"}


@dataclass(frozen=True)
class _Flags:
    model: str | None
    ctx_size: int
    parallel: int
    kv_unified: bool | None
    kv_types: tuple[str, str]


def _read_flags(tokens: Sequence[str], origin: str) -> _Flags:
    """Read the flags we care about; later values win, as in llama-server."""
    model: str | None = None
    ctx_size: int | None = None
    parallel: int | None = None
    kvu: bool | None = None
    cache_k: str | None = None
    cache_v: str | None = None
    env: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        flag, eq, inline = token.partition("=")
        key = _ENV_KEYS.get(flag.rsplit(" ", 1)[-1]) if eq else None
        if key is not None:
            env[key] = inline
            i += 1
            continue
        takes_value = flag in (
            _MODEL_FLAGS
            | _HF_FLAGS
            | _CTX_FLAGS
            | _PARALLEL_FLAGS
            | _CACHE_K_FLAGS
            | _CACHE_V_FLAGS
        )
        if takes_value and flag.startswith("-"):
            if eq:
                value = inline
            elif i + 1 < len(tokens):
                i += 1
                value = tokens[i]
            else:
                raise UsageError(f"{origin}: {flag} is missing its value")
            if flag in _MODEL_FLAGS or (flag in _HF_FLAGS and model is None):
                model = value
            elif flag in _CTX_FLAGS:
                ctx_size = _int_value(flag, value, origin)
            elif flag in _PARALLEL_FLAGS:
                parallel = _int_value(flag, value, origin)
            elif flag in _CACHE_K_FLAGS:
                cache_k = value
            elif flag in _CACHE_V_FLAGS:
                cache_v = value
        elif token in _KVU_ON:
            kvu = True
        elif token in _KVU_OFF:
            kvu = False
        i += 1
    if model is None and "model" in env:
        model = env["model"]
    if ctx_size is None and "ctx" in env:
        ctx_size = _int_value("LLAMA_ARG_CTX_SIZE", env["ctx"], origin)
    if parallel is None and "parallel" in env:
        parallel = _int_value("LLAMA_ARG_N_PARALLEL", env["parallel"], origin)
    if kvu is None and "kvu" in env:
        kvu = _truthy(env["kvu"])
    cache_k = cache_k if cache_k is not None else env.get("cache_k", DEFAULT_CACHE_TYPE)
    cache_v = cache_v if cache_v is not None else env.get("cache_v", DEFAULT_CACHE_TYPE)
    return _Flags(
        model=model,
        ctx_size=DEFAULT_CTX_SIZE if ctx_size is None else ctx_size,
        parallel=DEFAULT_PARALLEL if parallel is None else parallel,
        kv_unified=kvu,
        kv_types=(cache_k, cache_v),
    )


def kv_types_of(argv: Sequence[str]) -> tuple[str, str]:
    """The (K, V) cache types a llama-server argv runs with (llama-server's default f16)."""
    return _read_flags(argv, "argv").kv_types


def cell_from_flags(
    tokens: Sequence[str],
    origin: str,
    *,
    model: str | None = None,
    alias: str | None = None,
    trained_ctx: int | None = None,
) -> DeployCell:
    """The cell a llama-server argv runs (pure).

    ``model`` overrides ``-m`` (a models.toml ``gguf``); ``trained_ctx`` is the model's
    training context, used when ``-c`` is 0 or absent.
    """
    flags = _read_flags(tokens, origin)
    chosen = model if model is not None else flags.model
    if not chosen:
        raise UsageError(f"{origin}: no model (-m/--model) in this llama-server command")
    if flags.parallel == 0 or flags.parallel < -1:
        raise UsageError(f"{origin}: invalid --parallel {flags.parallel}")
    if flags.ctx_size < 0:
        raise UsageError(f"{origin}: invalid --ctx-size {flags.ctx_size}")
    auto = flags.parallel == -1
    parallel = AUTO_PARALLEL_SLOTS if auto else flags.parallel
    # llama-server turns auto slots into a unified KV cache unless told otherwise.
    unified = flags.kv_unified if flags.kv_unified is not None else auto
    total = flags.ctx_size if flags.ctx_size > 0 else trained_ctx
    per_slot: int | None = None
    if total is not None:
        per_slot = total if unified else total // parallel
    names = tuple(dict.fromkeys(n for n in (model_key(chosen), alias) if n))
    return DeployCell(
        origin=origin,
        model=chosen,
        names=names,
        ctx_size=flags.ctx_size,
        parallel=parallel,
        kv_unified=unified,
        ctx=per_slot,
        kv_types=flags.kv_types,
    )


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join backslash-continued lines; keep the number of each line's first physical line."""
    out: list[tuple[int, str]] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not buffer:
            start = number
        stripped = raw.rstrip()
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1])
            continue
        buffer.append(stripped)
        out.append((start, " ".join(buffer)))
        buffer = []
    if buffer:
        out.append((start, " ".join(buffer)))
    return out


def _is_server_token(token: str) -> bool:
    base = token.rsplit("=", 1)[-1].rsplit("/", 1)[-1]
    return base.startswith("llama-server")


def command_lines(text: str, name: str) -> list[tuple[str, list[str]]]:
    """The llama-server command lines in a text file: ``(origin, tokens)`` each (pure).

    A logical line counts when it names a ``llama-server`` executable or passes a model flag
    (``-m``/``--model``/``-hf``, or ``LLAMA_ARG_MODEL=``).
    """
    found: list[tuple[str, list[str]]] = []
    for number, line in _logical_lines(text):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as exc:
            raise UsageError(f"{name}:{number}: cannot parse the command line ({exc})") from None
        server = any(_is_server_token(t) for t in tokens)
        has_model = any(
            t.partition("=")[0] in _MODEL_FLAGS | _HF_FLAGS or t.startswith("LLAMA_ARG_MODEL=")
            for t in tokens
        )
        if server or has_model:
            found.append((f"{name}:{number}", tokens))
    return found


def _flag_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return [str(v) for v in value]
    raise UsageError(f"{where}: server_flags must be a list of strings or one string")


@dataclass(frozen=True)
class TomlEntry:
    origin: str
    gguf: str
    alias: str | None
    flags: tuple[str, ...]


def toml_entries(data: Mapping[str, Any], name: str) -> tuple[TomlEntry, ...]:
    """The ``[[models]]`` entries of a models.toml-style mapping, with merged flags (pure)."""
    defaults = data.get("defaults", {})
    if not isinstance(defaults, Mapping):
        raise UsageError(f"{name}: [defaults] must be a table")
    base = _flag_list(defaults.get("server_flags"), f"{name} [defaults]")
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise UsageError(f"{name}: no [[models]] entries; add one with gguf = ... per model")
    entries: list[TomlEntry] = []
    for index, entry in enumerate(models, start=1):
        if not isinstance(entry, Mapping):
            raise UsageError(f"{name}: [[models]] entry {index} is not a table")
        alias = entry.get("alias")
        where = f"{name} [{alias}]" if isinstance(alias, str) else f"{name} [[models]] #{index}"
        gguf = entry.get("gguf")
        if not isinstance(gguf, str) or not gguf:
            raise UsageError(f'{where}: missing gguf = "path/to/model.gguf"')
        flags = base + _flag_list(entry.get("server_flags"), where)
        kv = entry.get("kv")
        if kv is not None:
            if not isinstance(kv, str) or not kv:
                raise UsageError(f'{where}: kv must be a cache type string such as "q8_0"')
            # As run-live applies it: both cache types, after the registry's own flags.
            flags += ["--cache-type-k", kv, "--cache-type-v", kv]
        entries.append(
            TomlEntry(
                origin=where,
                gguf=gguf,
                alias=alias if isinstance(alias, str) else None,
                flags=tuple(flags),
            )
        )
    return tuple(entries)


def _trained_ctx(model: str, flags: Sequence[str], origin: str) -> int | None:
    """The model's training context from its GGUF header, when -c leaves it to the model."""
    if _read_flags(flags, origin).ctx_size > 0:
        return None
    path = Path(model)
    if not path.is_file():
        return None
    from batch_invariance.engines.gguf import parse_info

    try:
        return parse_info(path).context_length
    except UsageError:
        return None


def _resolve_models_dir(gguf: str, models_dir: str | None) -> str:
    if "{MODELS_DIR}" in gguf and models_dir:
        return gguf.replace("{MODELS_DIR}", models_dir.rstrip("/"))
    return gguf


def load_deploy_config(path: Path, models_dir: str | None = None) -> tuple[DeployCell, ...]:
    """Read a deploy config (command-line file or models.toml) and return its cells."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read deploy config {path}: {exc.strerror or exc}") from None
    name = path.name
    data: dict[str, Any] | None = None
    if path.suffix.lower() == ".toml":
        toml = _toml_module()
        try:
            data = toml.loads(text)
        except toml.TOMLDecodeError as exc:
            raise UsageError(f"{name}: not valid TOML ({exc})") from None
    cells: list[DeployCell] = []
    if data is not None:
        for entry in toml_entries(data, name):
            gguf = _resolve_models_dir(entry.gguf, models_dir)
            cells.append(
                cell_from_flags(
                    entry.flags,
                    entry.origin,
                    model=gguf,
                    alias=entry.alias,
                    trained_ctx=_trained_ctx(gguf, entry.flags, entry.origin),
                )
            )
    else:
        for origin, tokens in command_lines(text, name):
            probe = _read_flags(tokens, origin).model
            trained = _trained_ctx(probe, tokens, origin) if probe else None
            cells.append(cell_from_flags(tokens, origin, trained_ctx=trained))
    if not cells:
        raise UsageError(
            f"{name}: no llama-server command line (with -m/--model) and no [[models]] entry "
            "found; pass the file that starts the server"
        )
    return tuple(cells)


# --------------------------------------------------------------------------- cert checks


@dataclass(frozen=True)
class _IndexedCert:
    path: Path
    model: str
    ctx: int
    n: int
    #: Why the file is not a valid cert, when it names a cell but fails to read.
    error: str | None = None
    #: KV cache types of the B/C server the cert measured (from its provenance argv).
    kv_types: tuple[str, str] | None = None


@dataclass(frozen=True)
class CertIndex:
    certs: tuple[_IndexedCert, ...]
    #: JSON files that are not readable certs (named when a cell finds no cert).
    unreadable: tuple[str, ...]


def index_certs(certs_dir: Path) -> CertIndex:
    """Every readable cert under ``certs_dir`` (recursively; bundles skipped)."""
    from batch_invariance.cert.store import read_cert

    if not certs_dir.is_dir():
        raise UsageError(f"certs folder not found: {certs_dir}")
    found: list[_IndexedCert] = []
    unreadable: list[str] = []
    for path in sorted(certs_dir.rglob("*.json")):
        # Bundles are not certs; a superseded cert was replaced by a newer run of its cell.
        if path.name.endswith(".sigstore.json") or ".superseded-" in path.name:
            continue
        if not path.is_file():
            continue
        try:
            cert: Any = read_cert(path)
        except CertInvalid as exc:
            claimed = _claimed_cell(path)
            if claimed is None:
                unreadable.append(f"{path.name} ({exc})")
            else:
                found.append(_IndexedCert(path, claimed[0], claimed[1], claimed[2], error=str(exc)))
            continue
        found.append(
            _IndexedCert(
                path=path,
                model=str(cert.model),
                ctx=int(cert.ctx),
                n=int(cert.dispatch_n),
                kv_types=measured_kv_types(cert.provenance),
            )
        )
    return CertIndex(certs=tuple(found), unreadable=tuple(unreadable))


def measured_kv_types(provenance: Mapping[str, Any]) -> tuple[str, str] | None:
    """KV cache types of the parallel (B/C) server a cert's provenance records; ``None`` when
    the cert records no server argv (then the types cannot be checked, and fail closed)."""
    servers = provenance.get("servers") if isinstance(provenance, Mapping) else None
    if not isinstance(servers, list):
        return None
    for server in servers:
        if isinstance(server, Mapping) and server.get("role") == "BC":
            argv = server.get("argv")
            if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
                return kv_types_of(argv)
    return None


def _claimed_cell(path: Path) -> tuple[str, int, int] | None:
    """The cell an invalid cert file claims to be for, so a tampered cert is named as such."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    model, ctx, n = data.get("model"), data.get("ctx"), data.get("dispatch_n")
    if isinstance(model, str) and type(ctx) is int and type(n) is int:
        return model, ctx, n
    return None


def _matches(entry: _IndexedCert, cell: DeployCell) -> bool:
    return (
        model_key(entry.model) in cell.names and entry.ctx == cell.ctx and entry.n == cell.parallel
    )


def _check_one_cert(path: Path, bundle_policy: BundlePolicy | None) -> tuple[CheckKind, str]:
    from batch_invariance.cert.certificate import display_verdict, is_promotable
    from batch_invariance.cert.signing import bundle_path_for, verify_bundle
    from batch_invariance.cert.store import read_cert
    from batch_invariance.cert.verify import verify_cert_file

    try:
        verify_cert_file(path)
        cert: Any = read_cert(path)
    except CertInvalid as exc:
        return "invalid", f"cert {path.name} is invalid: {exc}"
    if not is_promotable(cert):
        verdict = display_verdict(str(getattr(cert, "status", "")))
        source = getattr(cert, "source", "?")
        gate = getattr(cert, "gate", "?")
        return (
            "not_promotable",
            f"cert {path.name} is not promotable ({verdict}, source={source}, gate={gate})",
        )
    if bundle_policy is not None:
        try:
            verify_bundle(
                path,
                bundle_path_for(path),
                bundle_policy.identity,
                bundle_policy.issuer,
                bundle_policy.repository,
                bundle_policy.offline,
            )
        except CertInvalid as exc:
            return "invalid", f"cert {path.name}: {exc}"
    return "ok", f"cert {path.name} is promotable"


def check_cell(cell: DeployCell, index: CertIndex, bundle_policy: BundlePolicy | None) -> CellCheck:
    """Decide one cell: every cert found for it must pass (fail closed on any that does not)."""
    if cell.ctx is None:
        return CellCheck(
            cell=cell,
            kind="unknown_ctx",
            reason=(
                "context per slot unknown (no -c/--ctx-size and the model file is not readable "
                "here); set -c explicitly in the deploy config"
            ),
        )
    matches = [entry for entry in index.certs if _matches(entry, cell)]
    if not matches:
        hint = f"; unreadable files: {', '.join(index.unreadable)}" if index.unreadable else ""
        return CellCheck(
            cell=cell,
            kind="missing",
            reason=f"no cert for {cell.label} (run the cell and add its cert){hint}",
        )
    for entry in matches:
        if entry.error is None and entry.kv_types != cell.kv_types:
            measured = "unknown" if entry.kv_types is None else "/".join(entry.kv_types)
            return CellCheck(
                cell=cell,
                kind="missing",
                reason=(
                    f"cert {entry.path.name} was measured with KV cache types (K/V) {measured}, "
                    f"but {cell.origin} runs {'/'.join(cell.kv_types)}: run the cell with the "
                    "deploy's cache types and add that cert"
                ),
                cert=entry.path,
            )
        if entry.error is not None:
            return CellCheck(
                cell=cell,
                kind="invalid",
                reason=f"cert {entry.path.name} is invalid: {entry.error}",
                cert=entry.path,
            )
        kind, reason = _check_one_cert(entry.path, bundle_policy)
        if kind != "ok":
            return CellCheck(cell=cell, kind=kind, reason=reason, cert=entry.path)
    last = matches[-1]
    names = ", ".join(m.path.name for m in matches)
    return CellCheck(
        cell=cell,
        kind="ok",
        reason=f"promotable cert: {names}" + (" (signature verified)" if bundle_policy else ""),
        cert=last.path,
    )


def check_cells(
    config: Path,
    cells: Sequence[DeployCell],
    certs_dir: Path,
    bundle_policy: BundlePolicy | None = None,
) -> DeployReport:
    """Check every cell with parallel > 1 against the certs in ``certs_dir``."""
    index = index_certs(certs_dir)
    checks = tuple(check_cell(cell, index, bundle_policy) for cell in cells if cell.needs_cert)
    serial = tuple(cell for cell in cells if not cell.needs_cert)
    return DeployReport(config=config, checks=checks, serial=serial)
