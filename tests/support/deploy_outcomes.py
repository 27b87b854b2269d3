"""check-deploy outcomes built from cell checks, as the gate decides them: the outputs its
data, text and GitHub annotation tests read (test_outcome.py, test_deploy_output.py)."""

from __future__ import annotations

from pathlib import Path

from batch_invariance.deploy.deploy_report import DeployReport
from batch_invariance.deploy.outcome import DeployOutcome, deploy_outcome
from batch_invariance.gate.cells import DeployCell, cell_of
from batch_invariance.gate.check import CellCheck, CheckKind
from batch_invariance.gate.server_command import NotUnderstood, ServerCommand

CONFIG = Path("deploy/llm.sh")
CERTS = Path("certs")
MODEL = "/models/gemma-3-270m-q4_k_m.gguf"


def cell(origin: str, *flags: str, notes: tuple[str, ...] = ()) -> DeployCell:
    """The cell of one server a deploy file starts (read by the one cell reader)."""
    argv = ("llama-server", "-m", MODEL, *flags)
    return cell_of(ServerCommand(origin=origin, argv=argv, env={}, notes=notes))


def check(at: DeployCell, kind: CheckKind, reason: str, **kw: object) -> CellCheck:
    return CellCheck(at, kind, reason, **kw)  # type: ignore[arg-type]


def outcome(
    checks: tuple[CellCheck, ...] = (), serial: tuple[DeployCell, ...] = (),
    constructs: tuple[NotUnderstood, ...] = (), unsigned: bool = True
) -> DeployOutcome:  # fmt: skip
    report = DeployReport(CONFIG, checks, serial, unsigned, tuple(str(c) for c in constructs))
    return deploy_outcome(report, constructs, CERTS)


def covered(origin: str = "llm.sh:4") -> CellCheck:
    cert = CERTS / "gemma-3-270m-q4_k_m__ctx1024__N4.json"
    at = cell(origin, "-c", "4096", "-np", "4", notes=("EnvironmentFile=-/x is absent here",))
    return check(at, "ok", "promotable cert: gemma-3-270m-q4_k_m__ctx1024__N4.json", cert=cert,
                 answers_up_to=80)  # fmt: skip


def mixed() -> DeployOutcome:
    """A serial cell, a covered one, one with no cert, a compose service with an invalid cert
    and a cell whose cert was found while its model file is not here."""
    missing = cell("llm.sh:6", "-c", "8192", "-np", "8")
    compose = cell("compose.yml [llm]", "-c", "4096", "-np", "4")
    absent = cell("llm.sh:8", "-c", "4096", "-np", "4")
    found = "gemma-3-270m-q4_k_m__ctx1024__N4.json"
    return outcome(
        checks=(
            covered(),
            check(missing, "missing", f"no cert for {missing.label} (run the cell)"),
            check(compose, "invalid", "cert x.json is invalid: digest mismatch",
                  cert=CERTS / "x.json"),
            check(absent, "unverifiable", f"cert {found} agrees on everything checkable here, "
                  f"but this machine cannot tell whether it measured this deploy: model file "
                  f"{MODEL} not found here: its identity (sha256, or size and name) cannot be "
                  "checked", cert=CERTS / found),
        ),
        serial=(cell("llm.sh:2", "-c", "1024", "-np", "1"),),
    )  # fmt: skip


def outside() -> DeployOutcome:
    """Constructs outside the grammar: in the script, in an absolute drop-in, in no line."""
    return outcome(
        constructs=(
            NotUnderstood("llm.sh", 3, "running curl (not in the grammar)", "do it elsewhere"),
            NotUnderstood("/etc/systemd/system/llm.service.d/10-x.conf", 2, "PassEnvironment="),
            NotUnderstood("llm.sh", 0, "output written to /m.gguf, which llm.sh:5 reads"),
        ),
        unsigned=False,
    )
