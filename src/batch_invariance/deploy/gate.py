"""The deploy gate: a cert covers a deploy cell only if it measured exactly that cell.

A cell (see :mod:`batch_invariance.deploy.cells`) is covered when some cert in the certs folder
agrees with it on everything below, and every cert that agrees is valid, promotable, recorded
under a policy no looser than the defaults, and signed (unless ``--allow-unsigned``):

* model identity: the sha256 of the deploy's model file when it is readable here, otherwise
  its size and file name (when it can be stat'ed); a model that is not here cannot be
  identified, so the cell is not covered;
* server build: the sha256 of the deploy's server binary (``provenance.server_binary``); a
  binary that cannot be read here cannot be checked, so the cell is not covered;
* ctx per slot, N and the KV layout (split or unified; for unified, the same pool ``-c``),
  against the argv of the B/C server the cert records (``provenance.servers``);
* every option that is not neutral
(:func:`batch_invariance.engines.llama_server.flags.numerics_differences`
  over llama-server's own option table): KV cache types, ``-fa``, ``-b``, ``-ub``, ``-ngl``,
  ``--cache-ram``, MoE placement, speculative/draft, ``-bs``, LoRA ...; and the variables ggml
  reads (:func:`engine_env_differences`);
* nothing the cell itself cannot be covered for (``DeployCell.not_covered``: an option in no
  class, a word llama-server rejects, a config file it would read ...), and nothing in the file
  the reader did not model (``DeployReport.unmodelled``);
* answer length: a deploy that fixes ``-n L`` needs a cert measured at answers up to L tokens
  (``promotion_scope.answer_tokens_max``, else the run's ``n_predict``); a deploy with no cap
  (no ``-n``, or ``-n -1``) passes only with that measured length printed as its scope.

Each cert file is read once. A file that is not JSON (or holds NaN/Infinity) is named and
skipped; a cert that fails verification and claims a cell fails that cell as invalid.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, Protocol

from batch_invariance.cert.provenance import Provenance
from batch_invariance.cert.signature import (
    BundlePolicy,
    SignerPolicy,
    TrustRoot,
    verify_bundle,
)
from batch_invariance.cert.signing import (
    bundle_path_for,
)
from batch_invariance.cert.verify import verify_text
from batch_invariance.core.gpu_placement import placement_differences
from batch_invariance.core.scope import SequenceScope
from batch_invariance.deploy.cells import DeployCell
from batch_invariance.deploy.identity import (
    BuildIdentity,
    ModelIdentity,
    build_differences,
    identify_build,
    identify_model,
    model_differences,
)
from batch_invariance.deploy.prompt_cache import (
    cache_differences,
    is_cache_difference,
    measured_cache_flags,
)
from batch_invariance.deploy.sequence_scope import sequence_problem
from batch_invariance.deploy.serve_plan import ServeRefused, measured_argv
from batch_invariance.engines.llama_server.env import engine_env
from batch_invariance.engines.llama_server.flags import (
    FlagError,
    ServerFlags,
    numerics_differences,
    padded_context,
    read_flags,
    slot_layout,
)
from batch_invariance.errors import CertInvalid, UsageError

CheckKind = Literal["ok", "missing", "not_promotable", "invalid", "unknown", "unsigned"]


class BundleVerifier(Protocol):
    """Checks that ``bundle`` signs ``artifact`` for ``signer``; raises CertInvalid if not."""

    def __call__(
        self, artifact: Path, bundle: Path, wanted: SignerPolicy, trust: TrustRoot
    ) -> None: ...


@dataclass(frozen=True)
class CertFile:
    """One cert file, read and verified once."""

    path: Path
    #: Its provenance as the cert model reads it (empty when the file is no cert at all).
    provenance: Provenance
    #: Why it is not a valid cert (``None`` = valid).
    problem: str | None
    promotable: bool
    #: Why it is not promotable (verdict, source, gate, a looser policy).
    not_promotable: str | None
    #: The (model, ctx, N) it claims.
    model: str
    ctx: int
    n: int
    #: Flags of the B/C server it measured; ``None`` when it records no argv.
    measured: ServerFlags | None
    #: The longest answer it compared (``promotion_scope.answer_tokens_max``).
    answer_tokens_max: int | None = None
    #: Flags of the prompt-cache arm's server; ``None`` when it did not measure the cache.
    cache_measured: ServerFlags | None = None
    #: The sequence lengths it measured against its slot; ``None``: not recorded (a cert
    #: written before the scope rule), which covers no slot.
    sequence_scope: SequenceScope | None = None


@dataclass(frozen=True)
class CertIndex:
    certs: tuple[CertFile, ...]
    #: Files that are not certs at all (not JSON, NaN, no cell), named in messages.
    unreadable: tuple[str, ...]


@dataclass(frozen=True)
class CellCheck:
    cell: DeployCell
    kind: CheckKind
    reason: str
    cert: Path | None = None
    #: The longest answer the covering cert measured, when the deploy sets no ``-n`` cap:
    #: what a pass covers (longer answers were never compared).
    answers_up_to: int | None = None

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


@dataclass(frozen=True)
class DeployReport:
    config: Path
    checks: tuple[CellCheck, ...]
    #: Cells with parallel 1: nothing to certify.
    serial: tuple[DeployCell, ...]
    #: ``--allow-unsigned`` was used: signatures were not checked.
    unsigned_allowed: bool
    #: Constructs of the deploy file that mention a server but were not read.
    unmodelled: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.unmodelled and all(check.ok for check in self.checks)

    @property
    def failing(self) -> tuple[CellCheck, ...]:
        return tuple(check for check in self.checks if not check.ok)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a cert may hold")


def _bc_flags(provenance: Provenance) -> ServerFlags | None:
    try:
        return read_flags(measured_argv(provenance))
    except (ServeRefused, FlagError):
        return None


def read_cert_file(path: Path) -> CertFile | str:
    """Read and verify one cert file once; a file that is no cert at all gives its reason."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text, parse_constant=_reject_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        return f"{path.name} (not a readable cert: {' '.join(str(exc).split())[:120]})"
    if not isinstance(data, dict):
        return f"{path.name} (not a JSON object)"
    model, ctx, n = data.get("model"), data.get("ctx"), data.get("dispatch_n")
    if not (isinstance(model, str) and type(ctx) is int and type(n) is int):
        return f"{path.name} (names no model, ctx and dispatch_n)"
    # The one verification path: schema, digest, re-derived verdict, identity against the
    # provenance, and the one promotability rule (policy no looser than the defaults).
    found = verify_text(text, str(path), path)
    problem = "; ".join(found.problems) or None
    promotable = found.promotable and problem is None
    provenance = Provenance() if found.cert is None else found.cert.provenance
    return CertFile(
        path=path,
        provenance=provenance,
        problem=problem,
        promotable=promotable,
        not_promotable=None if promotable else "; ".join(found.promotable_reasons),
        model=model,
        ctx=ctx,
        n=n,
        measured=_bc_flags(provenance),
        answer_tokens_max=None
        if found.cert is None
        else found.cert.promotion_scope.answer_tokens_max,
        cache_measured=None
        if found.cert is None or found.cert.prompt_cache is None
        else measured_cache_flags(provenance),
        sequence_scope=None if found.cert is None else found.cert.sequence_scope,
    )


def index_certs(certs_dir: Path) -> CertIndex:
    """Every cert under ``certs_dir`` (recursively; bundles and superseded certs skipped)."""
    if not certs_dir.is_dir():
        raise UsageError(f"certs folder not found: {certs_dir}")
    found: list[CertFile] = []
    unreadable: list[str] = []
    for path in sorted(certs_dir.rglob("*.json")):
        if path.name.endswith(".sigstore.json") or ".superseded-" in path.name:
            continue
        if not path.is_file():
            continue
        read = read_cert_file(path)
        if isinstance(read, str):
            unreadable.append(read)
        else:
            found.append(read)
    return CertIndex(certs=tuple(found), unreadable=tuple(unreadable))


def _measured_length(cert: CertFile) -> int | None:
    if cert.answer_tokens_max is not None:
        return cert.answer_tokens_max
    plan = cert.provenance.plan
    return plan.n_predict if plan is not None else None


def engine_env_differences(deploy: Mapping[str, str], provenance: Provenance) -> tuple[str, ...]:
    """Variables ggml or the runtimes read that the deploy sets differently from the B/C
    server the cert measured (its recorded ``engine_env``; none recorded = none set)."""
    server = provenance.bc_server()
    info = server.info if server is not None else None
    recorded = info.engine_env if info is not None else None
    # A GPU-selection variable an older cert recorded is placement, not an engine variable.
    measured: Mapping[str, str] = engine_env(recorded or {})
    return tuple(
        f"environment {name}={deploy.get(name, '(unset)')} (measured "
        f"{measured.get(name, '(unset)')})"
        for name in sorted(set(deploy) | set(measured))
        if deploy.get(name) != measured.get(name)
    )


class CoverageRule(Protocol):
    """One thing a cert must have measured as the cell runs it: the differences (empty =
    the same). Rules are separate and composable: a new check is one more function in
    :data:`COVERAGE_RULES`, over the parsed deploy (``cell.flags``, ``cell.engine_env``)."""

    def __call__(
        self, cell: DeployCell, cert: CertFile, model: ModelIdentity
    ) -> tuple[str, ...]: ...


def model_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """The model file is the one measured (by the strongest identity available)."""
    return model_differences(model, cert.provenance)


def layout_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """N and the KV layout (and a unified pool's size) are the measured ones."""
    measured = cert.measured
    if measured is None:
        return ("the cert records no B/C server argv (layout and flags unknown)",)
    try:
        layout = slot_layout(measured)
    except FlagError as exc:
        return (f"the recorded B/C argv is not readable ({exc})",)
    out: list[str] = []
    if layout.parallel != cell.parallel:
        out.append(f"N {cell.parallel} (measured {layout.parallel})")
    if layout.kv_unified != cell.layout.kv_unified:
        measured_name = "unified" if layout.kv_unified else "split"
        out.append(f"KV layout {cell.layout_name} (measured {measured_name})")
    elif cell.layout.kv_unified:
        pool = padded_context(measured.ctx_size or 0, layout).pool
        if pool != cell.pool:
            out.append(f"unified KV pool of {cell.pool} tokens (measured {pool})")
    return tuple(out)


def options_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """Every option that is not neutral has the measured value."""
    if cert.measured is None:
        return ()
    # The prompt-cache options are the prompt-cache rule's (deploy/prompt_cache.py).
    compared = numerics_differences(cell.flags, cert.measured)
    return tuple(d for d in compared if not is_cache_difference(d))


def prompt_cache_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """A server that caches prompts is covered only by a cert that measured that caching."""
    return cache_differences(cell.flags, cert.cache_measured)


def environment_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """The variables the engine reads are the recorded ones."""
    return engine_env_differences(cell.engine_env, cert.provenance)


def answer_length_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """A fixed ``-n`` cap was measured; an uncapped deploy needs a measured length."""
    limit = cell.flags.n_predict
    longest = _measured_length(cert)
    if limit is not None and limit > 0:
        if longest is None:
            return (f"-n {limit}: the cert records no measured answer length",)
        if longest < limit:
            return (f"-n {limit}: the cert measured answers up to {longest} tokens only",)
    elif _uncapped(cell) and longest is None:
        return ("no -n cap: the cert records no measured answer length to scope a pass to",)
    return ()


def gpu_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """The GPUs the deploy selects on this host are the ones measured (where both are read)."""
    return placement_differences(cert.provenance.gpus, cell.gpus).differences


def sequence_length_rule(cell: DeployCell, cert: CertFile, model: ModelIdentity) -> tuple[str, ...]:
    """The measured sequences reach 3/4 of the deploy's slot (:func:`sequence_problem`)."""
    if cell.ctx is None:  # check_cell refuses such a cell before any rule runs
        return ("context per slot unknown",)
    problem = sequence_problem(cert.sequence_scope, cell.ctx)
    return () if problem is None else (problem,)


#: The coverage checks, in the order their differences are printed.
COVERAGE_RULES: tuple[CoverageRule, ...] = (
    model_rule, layout_rule, options_rule, prompt_cache_rule, environment_rule,
    answer_length_rule, sequence_length_rule, gpu_rule,
)  # fmt: skip


def config_differences(
    cell: DeployCell,
    cert: CertFile,
    model: ModelIdentity,
    rules: Sequence[CoverageRule] = COVERAGE_RULES,
) -> tuple[str, ...]:
    """Everything the cert measured differently from what the cell runs (empty = same)."""
    return tuple(difference for rule in rules for difference in rule(cell, cert, model))


def _uncapped(cell: DeployCell) -> bool:
    """The deploy sets no answer-length cap (no ``-n``, or a negative one: ``-1`` is
    unlimited, ``-2`` until the context fills)."""
    limit = cell.flags.n_predict
    return limit is None or limit < 0


class SignatureProblem(NamedTuple):
    """Why a cert's signature does not hold: the check's kind and a one-line reason."""

    kind: CheckKind
    reason: str


def _signature_problem(
    cert: CertFile, policy: BundlePolicy, verify: BundleVerifier
) -> SignatureProblem | None:
    bundle = bundle_path_for(cert.path)
    if not bundle.is_file():
        why = f"cert {cert.path.name} is not signed (no {bundle.name} beside it)"
        return SignatureProblem("unsigned", why)
    try:
        verify(cert.path, bundle, policy.signer, policy.trust)
    except CertInvalid as exc:
        return SignatureProblem("invalid", f"cert {cert.path.name}: {exc}")
    return None


def check_cell(
    cell: DeployCell,
    index: CertIndex,
    model: ModelIdentity,
    build: BuildIdentity,
    signing: BundlePolicy | None,
    verify: BundleVerifier = verify_bundle,
) -> CellCheck:
    """Decide one cell: a cert must have measured it, and every such cert must pass."""
    if cell.not_covered:
        return CellCheck(cell, "unknown", "; ".join(cell.not_covered))
    if cell.ctx is None:
        return CellCheck(
            cell,
            "unknown",
            "context per slot unknown (no -c/--ctx-size and the model file is not readable "
            "here); set -c explicitly in the deploy config",
        )
    claims = [c for c in index.certs if (c.ctx, c.n) == (cell.ctx, cell.parallel)]
    for cert in claims:
        if cert.problem is not None and cert.model in (cell.name, cell.alias):
            return CellCheck(cell, "invalid", f"cert {cert.path.name} is invalid: {cert.problem}")
    valid = [c for c in claims if c.problem is None]
    diffs = {
        c.path: config_differences(cell, c, model) + build_differences(build, c.provenance)
        for c in valid
    }
    same = [c for c in valid if not diffs[c.path]]
    if not same:
        hint = f"; unreadable files: {', '.join(index.unreadable)}" if index.unreadable else ""
        if not valid:
            return CellCheck(cell, "missing", f"no cert for {cell.label} (run the cell){hint}")
        shown = "; ".join(f"{c.path.name}: {', '.join(diffs[c.path])}" for c in valid)
        return CellCheck(cell, "missing", f"no cert measured this cell ({shown}){hint}")
    for cert in same:
        if not cert.promotable:
            reason = f"cert {cert.path.name} is not promotable ({cert.not_promotable})"
            return CellCheck(cell, "not_promotable", reason, cert.path)
        if signing is not None:
            bad = _signature_problem(cert, signing, verify)
            if bad is not None:
                return CellCheck(cell, bad.kind, bad.reason, cert.path)
    names = ", ".join(c.path.name for c in same)
    scope: int | None = None
    scope_text = ""
    if _uncapped(cell):
        scope = min(length for c in same if (length := _measured_length(c)) is not None)
        scope_text = f"; covers answers up to {scope} tokens only: the deploy sets no -n cap"
    if signing is None:
        signed = "UNSIGNED: --allow-unsigned"
    elif signing.signer.repository:
        signed = f"signature verified, signed for {signing.signer.repository}"
    else:
        signed = "signature verified for any repository: --any-repository"
    unchecked = placement_differences(same[-1].provenance.gpus, cell.gpus).unchecked
    placed = f"; {unchecked}" if unchecked else ""
    reason = (
        f"promotable cert: {names} (model by {model.method}, build by sha256 of "
        f"{build.shown}; {signed}){placed}{scope_text}"
    )
    return CellCheck(cell, "ok", reason, same[-1].path, scope)


def check_cells(
    config: Path,
    cells: Sequence[DeployCell],
    certs_dir: Path,
    signing: BundlePolicy | None,
    verify: BundleVerifier = verify_bundle,
    unmodelled: Sequence[str] = (),
    server_binary: Path | None = None,
) -> DeployReport:
    """Check every cell with parallel > 1; ``signing=None`` means ``--allow-unsigned``.

    ``verify`` is the bundle check (sigstore's; tests pass a fake). ``server_binary``
    (``--server-binary``) is the binary of cells whose deploy file names no readable one.
    """
    index = index_certs(certs_dir)
    identities: dict[str, ModelIdentity] = {}
    builds: dict[tuple[str, str | None, bool], BuildIdentity] = {}
    checks: list[CellCheck] = []
    for cell in cells:
        if not cell.needs_cert:
            continue
        key = str(cell.model_path) if cell.model_path is not None else "hf:" + cell.model
        if key not in identities:
            identities[key] = identify_model(cell.model_path, cell.model)
        named = "/" in cell.binary
        where = (str(cell.binary_path), cell.binary_missing, named)
        if where not in builds:
            builds[where] = identify_build(
                cell.binary_path, cell.binary_missing, server_binary, named=named
            )
        checks.append(check_cell(cell, index, identities[key], builds[where], signing, verify))
    serial = tuple(cell for cell in cells if not cell.needs_cert)
    return DeployReport(
        config, tuple(checks), serial, unsigned_allowed=signing is None,
        unmodelled=tuple(unmodelled),
    )  # fmt: skip
