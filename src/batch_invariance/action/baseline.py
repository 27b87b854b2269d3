"""The Action's ``baseline:``: compare the new cert with an earlier build's, fail on a policy.

``baseline`` is a cert file or folder under the workspace, ``release:latest`` or
``release:TAG``: the certs (``{model}__ctx{C}__N{N}.json``) and their sigstore bundles attached
to the repository's latest release (or the release of TAG), fetched with the GitHub REST API
(``GITHUB_API_URL``, ``GITHUB_REPOSITORY``, ``GITHUB_TOKEN``). The baseline is verified
before the cell runs (the one verification path, and its signature for ``baseline-identity``
unless ``baseline-allow-unsigned``); after the run the comparison is written beside the cert,
shown in the job summary, and ``fail-on`` (default ``scored``) says which class fails the job.
docs/compare.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from batch_invariance.cert.compare_view import Comparison, comparison_json
from batch_invariance.cert.schema import Cert
from batch_invariance.cert.signature import BundlePolicy, SignerPolicy, TrustRoot, policy_for
from batch_invariance.cert.signing import BUNDLE_SUFFIX
from batch_invariance.cert.store import atomic_write_text
from batch_invariance.core.compare import FAIL_ON, FailOn
from batch_invariance.errors import InfraError, UsageError
from batch_invariance.report.compare_load import (
    LoadedSide,
    compare_with_run,
    comparison_path,
    load_side,
    signature_words,
)
from batch_invariance.report.load import is_cert_name

__all__ = [
    "LATEST_RELEASE",
    "RELEASE_PREFIX",
    "BaselineInputs",
    "BaselineResult",
    "LoadedBaseline",
    "compare_run",
    "fetch_release_certs",
    "load_baseline",
    "read_baseline_inputs",
]

#: The ``baseline`` value that names the certs attached to the latest release; ``release:TAG``
#: names another release.
LATEST_RELEASE = "release:latest"
RELEASE_PREFIX = "release:"
_API_VERSION = "2022-11-28"
_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class BaselineInputs:
    """The baseline inputs, validated (``source`` empty: no baseline)."""

    source: str
    fail_on: FailOn
    signing: BundlePolicy | None


@dataclass(frozen=True)
class LoadedBaseline:
    """The verified baseline: its certs, where they came from and how they were checked."""

    path: Path
    sides: tuple[LoadedSide, ...]
    words: str
    fail_on: FailOn


def read_baseline_inputs(raw: Mapping[str, str], env: Mapping[str, str]) -> BaselineInputs:
    """``raw`` holds the step's input values (defaults applied); UsageError names a bad one."""
    source = raw["baseline"].strip()
    fail_on = raw["fail-on"].strip().lower()
    if fail_on not in FAIL_ON:
        raise UsageError(f"input fail-on must be one of {', '.join(FAIL_ON)}, got {fail_on!r}")
    allow = raw["baseline-allow-unsigned"].strip().lower() in {"true", "1", "yes", "on"}
    identity = raw["baseline-identity"].strip()
    issuer = raw["baseline-oidc-issuer"].strip()
    repository = raw["baseline-repository"].strip() or env.get("GITHUB_REPOSITORY", "")
    checked: FailOn = next(f for f in FAIL_ON if f == fail_on)
    if not source:
        return BaselineInputs("", checked, None)
    if allow:
        if identity:
            raise UsageError(
                "input baseline-allow-unsigned skips the baseline's signature; drop it or "
                "baseline-identity"
            )
        return BaselineInputs(source, checked, None)
    if not identity or not issuer or not repository:
        raise UsageError(
            "input baseline needs baseline-identity (a regular expression the signer's "
            "identity must match), baseline-oidc-issuer and baseline-repository (default: "
            "this repository), or baseline-allow-unsigned: true"
        )
    signer = SignerPolicy(identity, issuer, repository, identity_is_regexp=True)
    policy_for(signer)  # a bad regular expression is a usage error before anything runs
    return BaselineInputs(source, checked, BundlePolicy(signer, TrustRoot()))


def _api_get(session: requests.Session, url: str, token: str, accept: str) -> requests.Response:
    headers = {"Accept": accept, "X-GitHub-Api-Version": _API_VERSION}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        response = session.get(url, headers=headers, timeout=_TIMEOUT_S)
    except requests.RequestException as exc:
        raise InfraError(f"GitHub API {url}: {type(exc).__name__}: {exc}") from None
    return response


def fetch_release_certs(
    env: Mapping[str, str],
    dest: Path,
    session: requests.Session | None = None,
    tag: str | None = None,
) -> Path:
    """Download the certs and bundles attached to the latest release (or the release of
    ``tag``) into ``dest``."""
    api = (env.get("GITHUB_API_URL") or "https://api.github.com").rstrip("/")
    repo = env.get("GITHUB_REPOSITORY", "")
    token = env.get("GITHUB_TOKEN", "")
    if not repo:
        raise UsageError("a release baseline needs GITHUB_REPOSITORY (set by the runner)")
    http = session or requests.Session()
    which = LATEST_RELEASE if tag is None else RELEASE_PREFIX + tag
    path = "latest" if tag is None else f"tags/{quote(tag, safe='')}"
    url = f"{api}/repos/{repo}/releases/{path}"
    response = _api_get(http, url, token, "application/vnd.github+json")
    if response.status_code == 404:
        raise UsageError(
            f"baseline {which}: {repo} has no such published release (HTTP 404 from {url}); "
            "publish one with its certs attached, or leave baseline empty"
        )
    if response.status_code != 200:
        raise InfraError(f"GitHub API {url}: HTTP {response.status_code}")
    try:
        release: Any = response.json()
        assets = [a for a in release["assets"] if isinstance(a, dict)]
        name = str(release.get("tag_name", "?"))
    except (ValueError, KeyError, TypeError):
        raise InfraError(f"GitHub API {url}: the answer is not a release") from None
    wanted = [
        a
        for a in assets
        if isinstance(a.get("name"), str)
        and (is_cert_name(Path(a["name"])) or a["name"].endswith(".json" + BUNDLE_SUFFIX))
        and "/" not in a["name"]
    ]
    if not any(is_cert_name(Path(a["name"])) for a in wanted):
        raise UsageError(
            f"baseline {which}: release {name} of {repo} has no cert attached "
            "({model}__ctx{C}__N{N}.json); attach the cell's cert to the release"
        )
    dest.mkdir(parents=True, exist_ok=True)
    for asset in wanted:
        got = _api_get(http, str(asset.get("url", "")), token, "application/octet-stream")
        if got.status_code != 200:
            raise InfraError(f"GitHub API: asset {asset['name']}: HTTP {got.status_code}")
        (dest / asset["name"]).write_bytes(got.content)
    return dest


def load_baseline(
    inputs: BaselineInputs,
    workspace: Path,
    out_dir: Path,
    env: Mapping[str, str],
    session: requests.Session | None = None,
) -> LoadedBaseline | None:
    """The verified baseline, or ``None`` when the step gave none. Raises CertInvalid when a
    baseline cert or its signature does not verify (before anything runs)."""
    if not inputs.source:
        return None
    if inputs.source.startswith(RELEASE_PREFIX):
        tag = inputs.source[len(RELEASE_PREFIX) :]
        if not tag:
            raise UsageError("input baseline: release: needs latest or a tag (release:v1.2.0)")
        wanted = None if inputs.source == LATEST_RELEASE else tag
        path = fetch_release_certs(env, out_dir / "baseline", session, wanted)
    else:
        path = Path(inputs.source)
        path = path if path.is_absolute() else workspace / path
    sides = load_side(path, inputs.signing, baseline=True)
    return LoadedBaseline(path, tuple(sides), signature_words(inputs.signing), inputs.fail_on)


@dataclass(frozen=True)
class BaselineResult:
    """The new cert against the baseline: the comparison, where it was written, and why it
    fails the job under ``fail-on`` (empty: it passes)."""

    comparison: Comparison
    path: Path
    failures: tuple[str, ...]
    fail_on: FailOn


def compare_run(baseline: LoadedBaseline, cert: Cert, cert_path: Path) -> BaselineResult:
    """Compare the cert this run wrote with the baseline; write the JSON beside the cert."""
    comparison = compare_with_run(baseline.sides, baseline.path, cert, cert_path, baseline.words)
    target = comparison_path(cert_path)
    data = comparison_json(comparison, baseline.fail_on)
    atomic_write_text(target, json.dumps(data, indent=2, sort_keys=True) + "\n")
    failures = comparison.policy_failures(baseline.fail_on)
    return BaselineResult(comparison, target, failures, baseline.fail_on)
