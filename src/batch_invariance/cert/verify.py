"""The one verification path and the one promotability rule.

:func:`verify` is the one entry, with an explicit :class:`Depth`. In full it parses a cert once
(schema, digest: :mod:`~batch_invariance.cert.parse`), refuses one written under other rules,
checks that its evidence is one consistent record (:mod:`~batch_invariance.cert.structure`),
re-derives it once from its own evidence, checks its identity against its own provenance
(:mod:`~batch_invariance.cert.identity`) and then says whether it is promotable. Everything
that reads a cert asks it: ``verify-cert``, :func:`is_promotable`, :func:`cert_is_green`,
check-deploy and the Action.

The re-derivation is compared with the stored cert value by value, types included
(:mod:`~batch_invariance.cert.identical`); only when the two are not identical are their JSON
forms compared field by field, to name the fields. Both say the same; the first serialises
nothing (a cert of 1,000 prompts x 64 tokens is 20 MB of JSON).

The readers of many or large certs (``compare``, ``report``) verify at ``Depth.REMEMBERED``
with a :class:`~batch_invariance.cert.memo.VerifiedMemo`: bytes that already passed under
this code skip the duplicate-key scan, the digest and the re-derivation, and nothing else.
``verify-cert``, check-deploy and ``serve`` verify every cert in full on every read.

Fail closed: anything absent, malformed, re-digested after an edit, inconsistent with its
evidence or with its provenance is not promotable, and :func:`verify` never raises on one.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import NamedTuple

from batch_invariance import __version__
from batch_invariance.cert.advice import engine_advice
from batch_invariance.cert.build import differing_fields, rederive, rederive_draft
from batch_invariance.cert.identical import identical
from batch_invariance.cert.identity import identity_problems
from batch_invariance.cert.memo import VerifiedMemo, memo_key
from batch_invariance.cert.parse import parse_cert, version_problem
from batch_invariance.cert.schema import (
    GATE_ABC_UNION,
    Cert,
    CertHeader,
    canonical_json,
    cert_to_json,
    display_verdict,
)
from batch_invariance.cert.structure import structure_problems
from batch_invariance.core.evidence import policy_problems
from batch_invariance.engines.registry import recorded_launch
from batch_invariance.errors import CertInvalid

__all__ = [
    "DIGEST_SCOPE",
    "Depth",
    "Promotability",
    "Verification",
    "cert_is_green",
    "is_promotable",
    "promotability",
    "verify",
]

#: What the digest is for, said wherever a cert is reported valid.
DIGEST_SCOPE = "the digest catches accidents, not forgery"


class Depth(Enum):
    """What :func:`verify` checks; each depth names the callers it is for."""

    #: A cert this process just built from ``decide()``'s verdict (the cell's finish):
    #: structure, identity, promotability. Its version is this tool's, and re-deriving it
    #: would only run ``decide()`` again on the evidence its verdict was decided from; a cert
    #: that does not hold together is still never written as valid.
    BUILT = "built"
    #: A :class:`Cert` already in memory: version, structure, the re-derivation compared on
    #: the JSON forms field by field, identity, promotability. No schema or digest.
    PARSED = "parsed"
    #: Text, a file, a :class:`Cert` or a mapping through its JSON form: schema, duplicate
    #: keys, digest, version, structure, re-derivation, identity, promotability
    #: (``verify-cert``, check-deploy, ``serve``, ``sign``, :func:`is_promotable`).
    FULL = "full"
    #: ``FULL``, except that bytes the memo already passed under this code skip the
    #: duplicate-key scan, the digest and the re-derivation (``compare``, ``report``, the
    #: baselines); bytes that pass in full are remembered.
    REMEMBERED = "remembered"


@dataclass(frozen=True)
class Verification:
    """Everything known about one cert after the one verification path."""

    path: Path | None
    #: The parsed cert; ``None`` when it could not be parsed at all.
    cert: Cert | None
    #: Why the cert is invalid, first problem first; empty = valid.
    problems: tuple[str, ...]
    status: str | None
    verdict: str
    promotable: bool
    #: Why it is (one line) or is not (every unmet condition) promotable.
    promotable_reasons: tuple[str, ...]

    @property
    def valid(self) -> bool:
        return not self.problems

    def raise_if_invalid(self) -> Verification:
        """Raise :class:`CertInvalid` (exit 5) with the first problem (and a count of the
        others); a valid verification is returned as it is."""
        if self.problems:
            more = len(self.problems) - 1
            tail = f" (and {more} more problem(s))" if more else ""
            raise CertInvalid(self.problems[0] + tail)
        return self


class Promotability(NamedTuple):
    """Whether a valid cert may be promoted, and why (one line) or why not (each condition)."""

    promotable: bool
    reasons: tuple[str, ...]


def promotability(cert: Cert) -> Promotability:
    """The one promotability rule on a valid cert: status green, source live, gate
    ``abc_union``, policy no looser than the defaults."""
    unmet: list[str] = []
    if cert.status != "green":
        unmet.append(f"status is {cert.status} ({display_verdict(cert.status)}), not green")
        scope = cert.gates.get("sequence_length")
        if scope is not None and not scope.ok:  # name both lengths where the scope decided
            unmet.append(scope.reason)
    if cert.source != "live":
        unmet.append(f"source is {cert.source}: only a live run can be promoted")
    if cert.gate != GATE_ABC_UNION:
        unmet.append(f"gate is {cert.gate}, not {GATE_ABC_UNION}")
    unmet.extend(policy_problems(cert.evidence.policy))
    if unmet:
        return Promotability(False, tuple(unmet))
    return Promotability(
        True, ("status green, source live, gate abc_union, policy no looser than defaults",)
    )


def _rederivation_problems(cert: Cert, origin: str, json_checked: bool) -> list[str]:
    """``json_checked``: ``cert`` came through the JSON edge (schema, digest), so every value
    it holds serialises; then a rebuild type-strictly identical to it is consistent without
    serialising either (see :func:`~batch_invariance.cert.build.rederive_draft`). Anything
    else is judged on the JSON forms, field by field."""
    try:
        if json_checked and identical(
            replace(rederive_draft(cert, engine_advice), digest=cert.digest), cert
        ):
            return []
        rebuilt = rederive(cert, engine_advice)
        fields = differing_fields(cert, rebuilt)
    except Exception as exc:  # evidence that cannot be judged is not a valid cert
        return [
            f"{origin}: the embedded evidence cannot be re-judged ({type(exc).__name__}: {exc})"
        ]
    if not fields:
        return []
    if fields[0] == "status":
        return [
            f"{origin}: stored status {cert.status!r} but its own evidence gives "
            f"{rebuilt.status!r}; the verdict was edited or the evidence was changed"
        ]
    shown = ", ".join(fields[:5]) + (" ..." if len(fields) > 5 else "")
    return [f"{origin}: fields disagree with the verdict re-derived from its evidence: {shown}"]


def _invalid(path: Path | None, cert: Cert | None, problems: list[str]) -> Verification:
    return Verification(
        path=path,
        cert=cert,
        problems=tuple(problems),
        status=None if cert is None else cert.status,
        verdict="INVALID",
        promotable=False,
        promotable_reasons=("the cert is not valid: " + problems[0],),
    )


def _verified(
    cert: Cert, origin: str, path: Path | None, depth: Depth, release: str = __version__
) -> Verification:
    """Version, structure, re-derivation, identity. ``Depth.REMEMBERED`` here means the memo
    knew the bytes: no re-derivation. ``Depth.FULL``: ``cert`` came through the JSON edge."""
    header = CertHeader(cert.cert_version, cert.tool_version, cert.rules_version)
    version = version_problem(origin, header, release=release)
    if version is not None:
        return _invalid(path, cert, [version])
    problems = [f"{origin}: {p}" for p in structure_problems(cert)]
    if depth is not Depth.REMEMBERED:
        problems += _rederivation_problems(cert, origin, json_checked=depth is not Depth.PARSED)
    return _judged(cert, origin, path, problems)


def _judged(cert: Cert, origin: str, path: Path | None, problems: list[str]) -> Verification:
    problems = problems + [f"{origin}: {p}" for p in identity_problems(cert, recorded_launch)]
    if problems:
        return _invalid(path, cert, problems)
    rule = promotability(cert)
    return Verification(
        path=path,
        cert=cert,
        problems=(),
        status=cert.status,
        verdict=display_verdict(cert.status),
        promotable=rule.promotable,
        promotable_reasons=rule.reasons,
    )


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Verifying a cert allocates one object per embedded value (a million for 1,000
    prompts x 64 tokens) and no reference cycles; the cyclic collector would walk that
    graph again and again for nothing (about 200 ms of a one-second verification).
    Reference counting still frees everything; the collector resumes afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def verify(
    source: object,
    depth: Depth = Depth.FULL,
    *,
    origin: str | None = None,
    path: Path | None = None,
    memo: VerifiedMemo | None = None,
    release: str = __version__,
) -> Verification:
    """The one verification entry: ``source`` checked to ``depth`` (see :class:`Depth`).

    ``source`` is a :class:`Cert` (``BUILT``, ``PARSED``) or, for ``FULL`` and ``REMEMBERED``,
    cert JSON text (``str`` or ``bytes``), the :class:`~pathlib.Path` of a cert file (read
    once; ``origin`` and ``path`` default to it), a :class:`Cert` or a JSON-like mapping
    (checked through its JSON form, so values smuggled into a ``Cert`` past validation are
    caught). ``origin`` names the cert in its problems (default ``"cert"``); ``path`` is
    where it was read from. ``memo`` is read at ``REMEMBERED`` only; ``None`` there is full
    verification. ``release``: the version doing the verifying, this one (a test passes the
    next patch version to see whether that release will accept a cert). Never raises on a bad
    cert; a depth given the wrong kind of source, or a memo at another depth, is a
    programming error (:class:`TypeError`)."""
    if memo is not None and depth is not Depth.REMEMBERED:
        raise TypeError(f"a memo is read at Depth.REMEMBERED only, not at {depth}")
    if depth is Depth.BUILT or depth is Depth.PARSED:
        if not isinstance(source, Cert):
            raise TypeError(f"{depth} verifies a Cert, not {type(source).__name__}")
        where = "cert" if origin is None else origin
        if depth is Depth.BUILT:
            return _judged(
                source, where, path, [f"{where}: {p}" for p in structure_problems(source)]
            )
        return _verified(source, where, path, depth, release)
    if isinstance(source, Path):
        return _verify_path(source, origin, memo, release)
    if isinstance(source, (str, bytes)):
        return _verify_text(source, "cert" if origin is None else origin, path, memo, release)
    return _verify_object(source, release)


def _verify_text(
    text: str | bytes,
    origin: str,
    path: Path | None,
    memo: VerifiedMemo | None,
    release: str = __version__,
) -> Verification:
    """From cert JSON text. With ``memo``, bytes it knows skip the three checks it vouches
    for; bytes that pass in full are remembered."""
    with _cyclic_gc_paused():
        key = None if memo is None else memo_key(text)
        known = memo is not None and key is not None and memo.knows(key)
        try:
            cert = parse_cert(text, origin, content_known=known)
        except CertInvalid as exc:
            return _invalid(path, None, [str(exc)])
        depth = Depth.REMEMBERED if known else Depth.FULL
        verification = _verified(cert, origin, path, depth, release)
        if memo is not None and key is not None and not known and verification.valid:
            memo.remember(key)
        return verification


def _verify_path(
    path: Path, origin: str | None, memo: VerifiedMemo | None, release: str = __version__
) -> Verification:
    """Read the cert at ``path`` once and verify its text."""
    from batch_invariance.cert.store import read_cert_text

    try:
        text = read_cert_text(path)
    except CertInvalid as exc:
        return _invalid(path, None, [str(exc)])
    return _verify_text(text, str(path) if origin is None else origin, path, memo, release)


def _verify_object(cert: object, release: str = __version__) -> Verification:
    """Verify a :class:`Cert` or a JSON-like ``dict`` through its JSON form. Never raises."""
    try:
        if isinstance(cert, Cert):
            text = canonical_json(cert_to_json(cert))
        elif isinstance(cert, Mapping):
            text = canonical_json(dict(cert))
        else:
            return _invalid(None, None, [f"not a cert: {type(cert).__name__}"])
    except Exception as exc:
        return _invalid(None, None, [f"cert: cannot be written as JSON ({exc})"])
    return _verify_text(text, "cert", None, None, release)


def is_promotable(cert: object, require_gate: str = GATE_ABC_UNION) -> bool:
    """The one promotability rule: valid, status green, source live, gate ``require_gate``,
    policy no looser than the defaults. Never raises; a mock cert is never promotable."""
    verification = verify(cert)
    return (
        verification.promotable
        and verification.cert is not None
        and verification.cert.gate == require_gate
    )


def cert_is_green(cert: object, require_source: str = "live") -> bool:
    """True only for a valid cert whose status is literally ``"green"`` and whose source is
    ``require_source``. Never raises."""
    if isinstance(cert, Mapping) and (
        cert.get("status") != "green" or cert.get("source") != require_source
    ):
        return False
    verification = verify(cert)
    c = verification.cert
    return (
        verification.valid and c is not None and c.status == "green" and c.source == require_source
    )
