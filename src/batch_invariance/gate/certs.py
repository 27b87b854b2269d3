"""The certs a deploy is held against: each cert file read and verified once, with what the
gate compares of it (the cell it claims, the flags of the servers it measured, its answer
length and sequence scope).

A file that is not JSON (or holds NaN/Infinity) is named and skipped; a cert that fails
verification keeps its problem, and fails a cell it claims as invalid
(:mod:`batch_invariance.gate.check`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.cert.provenance import Provenance
from batch_invariance.cert.verify import Depth, verify
from batch_invariance.core.scope import SequenceScope
from batch_invariance.engines.llama_server.flags import FlagError, ServerFlags, read_flags
from batch_invariance.errors import UsageError
from batch_invariance.gate.prompt_cache import measured_cache_flags
from batch_invariance.gate.serve_line import ServeRefused
from batch_invariance.gate.served import measured_argv


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
    found = verify(text, Depth.FULL, origin=str(path), path=path)
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


def measured_length(cert: CertFile) -> int | None:
    if cert.answer_tokens_max is not None:
        return cert.answer_tokens_max
    plan = cert.provenance.plan
    return plan.n_predict if plan is not None else None
