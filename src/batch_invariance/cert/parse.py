"""Cert JSON text -> a validated, digest-checked :class:`Cert`, or one line saying why not.

The text is parsed once, by the schema's ``TypeAdapter``. Every failure is a
:class:`~batch_invariance.errors.CertInvalid` with a one-line message (exit 5): broken JSON,
NaN / Infinity, an integer too long to parse, a schema error, a key held twice by one JSON
object (a reader keeps one value silently), a digest that does not match, or a cert written
under another ``cert_version`` or ``rules_version`` (:func:`version_problem`: its rules are
not re-derivable here).
Pure: no files, no clocks.
"""

from __future__ import annotations

from pydantic import ValidationError

from batch_invariance import __version__
from batch_invariance.cert.schema import (
    CERT_VERSION,
    HEADER_ADAPTER,
    Cert,
    CertHeader,
    cert_from_json,
    cert_to_json,
    compute_digest,
)
from batch_invariance.cert.structure import duplicate_key
from batch_invariance.core.rules import RULES_VERSION, rules_words
from batch_invariance.errors import CertInvalid

_NON_FINITE = ("finite_number",)


def version_problem(origin: str, header: CertHeader, *, release: str = __version__) -> str | None:
    """The one line for a cert this tool cannot re-derive, or ``None``.

    A cert is re-derived here when it has this ``cert_version`` (the layout) and this
    ``rules_version`` (the decision rules), whichever release wrote it. One written before
    the rules were versioned holds the rules of exactly its ``tool_version``: only that
    release re-derives it. Fail closed: anything else is refused, saying which rules would
    re-derive it (:func:`reverify_words`). ``release`` is the version doing the reading (this
    one; a test passes the next patch version to see what that release will say)."""
    if header.cert_version == CERT_VERSION:
        if header.rules_version is None and header.tool_version == release:
            return None
        if header.rules_version == RULES_VERSION:
            return None
    return (
        f"{origin}: written by batch-invariance {header.tool_version} (cert_version "
        f"{header.cert_version}, {rules_words(header.rules_version, header.tool_version)}); "
        f"its rules are not re-derivable here (this is batch-invariance {release}, "
        f"cert_version {CERT_VERSION}, rules {RULES_VERSION}), so it is not promotable; "
        f"{reverify_words(header)}"
    )


def reverify_words(header: CertHeader) -> str:
    """How a cert of other rules or another layout can still be verified. It names the rules
    and the layout, never a ``pip install`` of the release that wrote it: a cert may come from
    a build that was never published (CHANGELOG.md says which rules each release holds)."""
    if header.rules_version is None:
        return (
            f"a cert without rules_version is re-derived only by the build of "
            f"batch-invariance {header.tool_version} that wrote it, so re-run the cell with "
            "this version to get one that records its rules"
        )
    layout = ""
    if header.cert_version != CERT_VERSION:
        layout = f"cert_version {header.cert_version} and "
    return (
        f"verify it with a release that reads {layout}rules {header.rules_version} "
        "(CHANGELOG.md names each release's rules) or re-run the cell with this version"
    )


def read_header(text: str | bytes) -> CertHeader | None:
    """The versions a cert text names, read leniently (``None``: not even those)."""
    try:
        return HEADER_ADAPTER.validate_json(text)
    except ValidationError:
        return None


def _schema_message(origin: str, exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return f"{origin}: does not match the cert schema"
    err = errors[0]
    kind = err.get("type", "")
    msg = str(err.get("msg", "invalid"))
    if kind == "json_invalid":
        why = str(err.get("ctx", {}).get("error", msg))
        return (
            f"{origin}: not valid JSON ({why}); the file is damaged, not a cert, or holds a "
            "number too long to parse"
        )
    if kind in ("dataclass_type", "dataclass_exact_type") and not err.get("loc"):
        return f"{origin}: a cert is a JSON object, got {type(err.get('input')).__name__}"
    where = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
    if kind in _NON_FINITE:
        msg = "NaN or Infinity, which a cert may not hold"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{origin}: does not match the cert schema: {where}: {msg}{more}"


def parse_cert(
    text: str | bytes, origin: str = "cert", *, content_known: bool = False, any_rules: bool = False
) -> Cert:
    """Parse and validate cert JSON text and check its digest; raises :class:`CertInvalid`.

    ``content_known``: these exact bytes already passed the duplicate-key scan and the digest
    under this code (:mod:`~batch_invariance.cert.memo`), so both are not recomputed; the
    schema is checked all the same. ``any_rules``: the caller reads a cert of this layout
    under any rules (a compare baseline), so a schema error is named as one even when the
    cert's rules are not these."""
    try:
        cert = cert_from_json(text)
    except ValidationError as exc:
        header = read_header(text)
        problem = None if header is None else version_problem(origin, header)
        if any_rules and header is not None and header.cert_version == CERT_VERSION:
            problem = None
        raise CertInvalid(problem or _schema_message(origin, exc)) from None
    if content_known:
        return cert
    twice = duplicate_key(text)
    if twice is not None:
        raise CertInvalid(
            f"{origin}: a JSON object holds the key {twice!r} twice, so a reader keeps one "
            "value and drops the other (a trial or a pass may be overwritten); not a valid cert"
        )
    try:
        computed = compute_digest(cert_to_json(cert))
    except ValueError:
        # Only free-form provenance can still hold a NaN here; the digest cannot cover it.
        raise CertInvalid(
            f"{origin}: holds NaN, Infinity or a number JSON cannot carry; not a valid cert"
        ) from None
    if cert.digest != computed:
        raise CertInvalid(
            f"{origin}: digest mismatch (stored {cert.digest[:19]}..., content gives "
            f"{computed[:19]}...): the cert was changed after it was written"
        )
    return cert
