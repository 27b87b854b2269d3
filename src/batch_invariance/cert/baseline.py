"""A compare baseline: a cert from an earlier release, read as far as its fields allow.

``compare`` (and ``run-live --baseline``, the Action's ``baseline:``) exists to read a cert an
earlier build wrote. A cert under this tool's rules (:func:`~batch_invariance.cert.parse.
version_problem` has nothing to say) is verified in full, as every cert is
(:func:`~batch_invariance.cert.verify.verify`). One written under other decision rules
(another ``rules_version``, or none recorded by another release) cannot have its verdict
re-derived here, but its layout is this one, so it is still read through the schema, the
duplicate-key scan and the digest, and its per-prompt answers, tokens and logprobs are
compared; its verdict is shown as it was written, and :attr:`Baseline.rules_note` says so.
Another ``cert_version`` is another layout: refused (exit 5), naming the layout to read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from batch_invariance import __version__
from batch_invariance.cert.memo import VerifiedMemo
from batch_invariance.cert.parse import parse_cert, read_header, version_problem
from batch_invariance.cert.schema import CERT_VERSION, Cert
from batch_invariance.cert.verify import Depth, verify
from batch_invariance.core.rules import RULES_VERSION, rules_words
from batch_invariance.errors import CertInvalid

__all__ = ["Baseline", "compared_fields", "read_baseline", "read_baseline_path", "rules_note"]


@dataclass(frozen=True)
class Baseline:
    """A baseline cert as compare reads it."""

    cert: Cert
    #: ``None``: verified in full under this tool's rules; else the line saying it was not.
    rules_note: str | None


def compared_fields(cert: Cert) -> tuple[str, ...]:
    """What of arm A a comparison can read: the scored answers always, the tokens and the
    logprobs where the cert recorded them."""
    trials = cert.evidence.a.values()
    fields = ["answers"]
    if any(t.tokens is not None for t in trials):
        fields.append("tokens")
    if any(t.token_logprobs is not None for t in trials):
        fields.append("logprobs")
    return tuple(fields)


def rules_note(cert: Cert) -> str:
    """The line for a baseline written under other rules than this tool's."""
    written = rules_words(cert.rules_version, cert.tool_version)
    if cert.rules_version is not None:
        written += f" by batch-invariance {cert.tool_version}"
    return (
        f"baseline written under {written} (this is "
        f"rules {RULES_VERSION}, batch-invariance {__version__}): its verdict is not "
        f"re-derived; compared: {', '.join(compared_fields(cert))}"
    )


def read_baseline(
    text: str | bytes, origin: str, path: Path | None = None, memo: VerifiedMemo | None = None
) -> Baseline:
    """The baseline cert of ``text``; raises :class:`CertInvalid` (exit 5) when it is not
    valid, or is of another layout."""
    header = read_header(text)
    if header is not None and header.cert_version != CERT_VERSION:
        raise CertInvalid(
            f"{origin}: a baseline of cert_version {header.cert_version} (written by "
            f"batch-invariance {header.tool_version}) has another layout than this tool reads "
            f"(cert_version {CERT_VERSION}), so its fields cannot be compared here; compare it "
            f"with a release that reads cert_version {header.cert_version}"
        )
    if header is None or version_problem(origin, header) is None:
        verification = verify(
            text, Depth.REMEMBERED, origin=origin, path=path, memo=memo
        ).raise_if_invalid()
        assert verification.cert is not None
        return Baseline(verification.cert, None)
    cert = parse_cert(text, origin, any_rules=True)
    return Baseline(cert, rules_note(cert))


def read_baseline_path(path: Path, memo: VerifiedMemo | None = None) -> Baseline:
    """:func:`read_baseline` of the cert file at ``path``."""
    from batch_invariance.cert.store import read_cert_text

    return read_baseline(read_cert_text(path), str(path), path, memo)
