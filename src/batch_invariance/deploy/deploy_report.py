"""check-deploy's report: a deploy file read into the cell of every server it starts
(:func:`load_deploy_cells`), each cell with parallel > 1 held against the certs by the gate's
rule (:func:`batch_invariance.gate.check.check_cell`, the one ``serve`` uses too), and the
deploy passes only when every cell is covered and nothing it starts was left unread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.cert.signature import BundlePolicy, verify_bundle
from batch_invariance.deploy.readers.config import read_deploy_file
from batch_invariance.gate.cells import DeployCell, cell_of
from batch_invariance.gate.certs import CertFile, CertIndex, index_certs
from batch_invariance.gate.check import BundleVerifier, CellCheck, check_cell
from batch_invariance.gate.identity import (
    BuildIdentity,
    ModelIdentity,
    identify_build,
    identify_model,
)
from batch_invariance.gate.server_command import NotUnderstood, origin_location

_TRUST_FIX = "install the tool where only you and root can write (chmod go-w)"


@dataclass(frozen=True)
class DeployCells:
    cells: tuple[DeployCell, ...]
    #: Constructs that mention a server but were not read (the deploy is not covered).
    unmodelled: tuple[str, ...]
    #: The same constructs with their file and line (for annotations and ``--json``).
    not_understood: tuple[NotUnderstood, ...] = ()


def load_deploy_cells(path: Path) -> DeployCells:
    """Read a deploy config: the cell of every server it starts, and what it could not read."""
    read = read_deploy_file(path)
    if read.not_understood:  # the file is not covered; its servers are not worth reading
        return DeployCells((), read.unmodelled, read.not_understood)
    cells = tuple(cell_of(command) for command in read.commands)
    untrusted = tuple(
        NotUnderstood(*origin_location(cell.origin), problem, _TRUST_FIX)
        for cell in cells
        for problem in cell.untrusted
    )
    if untrusted:  # what runs could differ from what was checked: no cell is worth reporting
        return DeployCells((), tuple(str(n) for n in untrusted), untrusted)
    return DeployCells(cells, read.unmodelled, read.not_understood)


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


def check_cells(
    config: Path,
    cells: Sequence[DeployCell],
    certs_dir: Path,
    signing: BundlePolicy | None,
    verify: BundleVerifier = verify_bundle,
    unmodelled: Sequence[str] = (),
    server_binary: Path | None = None,
    store: Sequence[CertFile] = (),
) -> DeployReport:
    """Check every cell with parallel > 1; ``signing=None`` means ``--allow-unsigned``.

    ``verify`` is the bundle check (sigstore's; tests pass a fake). ``server_binary``
    (``--server-binary``) is the binary of cells whose deploy file names no readable one.
    ``store``: the certs of the cert store that verified and are signed for the gate's policy
    (:mod:`batch_invariance.deploy.cert_store`), held beside the folder's.
    """
    index = index_certs(certs_dir)
    index = CertIndex((*index.certs, *store), index.unreadable)
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
