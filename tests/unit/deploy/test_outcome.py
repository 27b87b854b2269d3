"""check-deploy's outcome as data: each cell and construct with its file and line, the
decision and its exit code (the same rules the text output states)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.commands.reply import reply_text
from batch_invariance.deploy.deploy_report import DeployReport
from batch_invariance.deploy.outcome import (
    DeployOutcome,
    deploy_outcome,
    problem_file,
)
from batch_invariance.gate.cells import DeployCell, cell_of
from batch_invariance.gate.check import CellCheck, CheckKind
from batch_invariance.gate.server_command import NotUnderstood, ServerCommand, origin_location
from tests.support.golden import check_golden

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
    checks: tuple[CellCheck, ...] = (),
    serial: tuple[DeployCell, ...] = (),
    constructs: tuple[NotUnderstood, ...] = (),
    unsigned: bool = True,
) -> DeployOutcome:
    report = DeployReport(CONFIG, checks, serial, unsigned, tuple(str(c) for c in constructs))
    return deploy_outcome(report, constructs, CERTS)


def covered(origin: str = "llm.sh:4") -> CellCheck:
    cert = CERTS / "gemma-3-270m-q4_k_m__ctx1024__N4.json"
    at = cell(origin, "-c", "4096", "-np", "4", notes=("EnvironmentFile=-/x is absent here",))
    return check(at, "ok", "promotable cert: gemma-3-270m-q4_k_m__ctx1024__N4.json", cert=cert,
                 answers_up_to=80)  # fmt: skip


def mixed() -> DeployOutcome:
    """A serial cell, a covered one, one with no cert, a compose service whose cert is
    invalid and a cell whose cert was found while its model file is not here."""
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


@pytest.mark.parametrize(
    ("origin", "where"),
    [
        ("deploy.sh:3", ("deploy.sh", 3)),
        ("/etc/systemd/system/llm.service.d/10-measured.conf:3", (
            "/etc/systemd/system/llm.service.d/10-measured.conf", 3)),
        ("compose.yml [llm]", ("compose.yml", 0)),
        ("unit.service:0", ("unit.service", 0)),
        ("odd name", ("odd name", 0)),
    ],
)  # fmt: skip
def test_the_origin_of_each_reader_names_its_file_and_line(
    origin: str, where: tuple[str, int]
) -> None:
    assert origin_location(origin) == where


def test_a_named_file_is_a_path_beside_the_config() -> None:
    assert problem_file("llm.sh", CONFIG) == "deploy/llm.sh"
    assert problem_file("compose.override.yml", CONFIG) == "deploy/compose.override.yml"
    assert problem_file("/etc/llm.env", CONFIG) == "/etc/llm.env"


def test_each_failing_cell_is_one_problem_at_its_line() -> None:
    found = mixed()
    assert (found.decision, found.exit_code) == ("fail", exitcodes.CERT_INVALID)
    assert [c.result for c in found.cells] == ["skip", "pass", "fail", "fail", "fail"]
    assert [(p.file, p.line, p.rule) for p in found.problems] == [
        ("deploy/llm.sh", 6, "missing"),
        ("deploy/compose.yml", None, "invalid"),
        ("deploy/llm.sh", 8, "unverifiable"),
    ]
    # A cert found and refused is named; a cell with no cert names none.
    assert [c.cert for c in found.cells if c.result == "fail"] == [
        None, "certs/x.json", "certs/gemma-3-270m-q4_k_m__ctx1024__N4.json",
    ]  # fmt: skip
    assert found.problems[0].message.startswith("gemma-3-270m-q4_k_m ctx=1024 N=8 kv=split: ")


def test_constructs_outside_the_grammar_fail_with_exit_3() -> None:
    found = outside()
    assert (found.decision, found.exit_code) == ("fail", exitcodes.NOT_PROMOTABLE)
    assert [(p.file, p.line, p.origin) for p in found.problems] == [
        ("deploy/llm.sh", 3, "llm.sh:3"),
        ("/etc/systemd/system/llm.service.d/10-x.conf", 2,
         "/etc/systemd/system/llm.service.d/10-x.conf:2"),
        ("deploy/llm.sh", None, "llm.sh"),
    ]  # fmt: skip
    assert found.problems[0].message == "not understood: running curl (not in the grammar); " \
        "do it elsewhere"  # fmt: skip
    assert found.signatures_checked and "UNSIGNED" not in found.summary


def test_pass_and_nothing_batched_exit_0() -> None:
    passed = outcome(checks=(covered(),))
    assert (passed.decision, passed.exit_code, passed.problems) == ("pass", 0, ())
    assert "covers answers up to 80 tokens" in passed.summary
    nothing = outcome(serial=(cell("llm.sh:2", "-c", "1024", "-np", "1"),))
    assert (nothing.decision, nothing.exit_code) == ("pass", 0)
    assert "runs no batched cell" in nothing.summary


def test_the_json_object_is_golden() -> None:
    check_golden("check_deploy.json", reply_text(mixed()))
