"""check-deploy's outcome as data: each cell and construct with its file and line, the
decision and its exit code (the same rules the text output states)."""

from __future__ import annotations

import pytest

from batch_invariance import exitcodes
from batch_invariance.commands.reply import reply_text
from batch_invariance.deploy.outcome import problem_file
from batch_invariance.gate.server_command import origin_location
from tests.support.deploy_outcomes import CONFIG, cell, covered, mixed, outcome, outside
from tests.support.golden import check_golden


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
    """Each failing cell of :func:`mixed` is one problem at its line, a cert found and refused
    named, exit 5 (an invalid cert)."""
    check_golden("check_deploy.json", reply_text(mixed()))
