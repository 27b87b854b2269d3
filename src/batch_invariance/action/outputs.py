"""What the Action hands back to the runner: step outputs in ``$GITHUB_OUTPUT`` (heredoc
form, safe for any value), and appends to runner file-command files."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path

from batch_invariance.cert.certificate import Cert, cert_is_green, display_verdict, is_promotable
from batch_invariance.errors import InfraError
from batch_invariance.report.render import Require

#: The outputs the Action writes (``action.yml`` declares the same names).
OUTPUT_NAMES: tuple[str, ...] = (
    "status",
    "verdict",
    "promotable",
    "cert-path",
    "bundle-path",
    "divergent-ids",
    "cell",
    "cell-id",
    "comparison-path",
    "baseline-worst",
    "debug-paths",
)


def format_outputs(values: Mapping[str, str]) -> str:
    """``$GITHUB_OUTPUT`` text in the heredoc form, with a delimiter no value contains."""
    chunks: list[str] = []
    for name, value in values.items():
        delimiter = f"ghadelimiter_{uuid.uuid4().hex}"
        while delimiter in value:  # pragma: no cover - a 128-bit collision
            delimiter = f"ghadelimiter_{uuid.uuid4().hex}"
        chunks.append(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
    return "".join(chunks)


def append_runner_file(path_value: str | None, text: str) -> None:
    """Append to a runner file-command file; a failure is an :class:`InfraError`."""
    if not path_value:
        return
    try:
        with open(path_value, "a", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise InfraError(
            f"cannot write the runner file {path_value}: {exc.strerror or exc}"
        ) from None


def relative_to_workspace(path: Path, workspace: Path) -> str:
    """``path`` relative to the workspace when inside it (what later host steps can use)."""
    try:
        return str(path.resolve().relative_to(workspace.resolve()))
    except ValueError:
        return str(path)


def outputs_for(
    cert: Cert,
    cert_path: Path,
    bundle: Path | None,
    workspace: Path,
    comparison: Path | None = None,
    worst: str | None = None,
) -> dict[str, str]:
    """The step's outputs; ``comparison`` and ``worst`` only with a baseline."""
    return {
        "status": str(cert.status),
        "verdict": display_verdict(str(cert.status)),
        "promotable": "true" if is_promotable(cert) else "false",
        "cert-path": relative_to_workspace(cert_path, workspace),
        "bundle-path": relative_to_workspace(bundle, workspace) if bundle else "",
        "divergent-ids": str(len(cert.divergence_report.ac.divergent_ids)),
        "cell": f"{cert.model}/{cert.ctx}/{cert.dispatch_n}",
        "cell-id": cert_path.stem,
        "comparison-path": relative_to_workspace(comparison, workspace) if comparison else "",
        "baseline-worst": worst or "no-baseline",
        # Set by the entrypoint when the step does not pass (action/failure.py).
        "debug-paths": "",
    }


def require_holds(cert: Cert, require: Require) -> bool:
    """The job's check: ``green`` (a live GREEN), ``promotable``, ``cert`` (a live cert was
    written, whatever its verdict: for a caller that gates on the cert itself) or ``none``
    (only with a baseline, which then decides the job). A mock cert never passes."""
    if require in ("cert", "none"):
        return cert.source != "mock"
    return bool(cert_is_green(cert) if require == "green" else is_promotable(cert))
