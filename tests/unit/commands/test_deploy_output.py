"""check-deploy's GitHub annotations: one ``::error`` per problem on its file and line,
escaped as GitHub reads workflow commands, the file relative to the job's workspace."""

from __future__ import annotations

import pytest

from batch_invariance.commands.deploy_output import (
    deploy_annotations,
    deploy_text,
    error_annotation,
    in_github_job,
    workspace_path,
)
from tests.support.deploy_outcomes import covered, mixed, outcome, outside
from tests.support.golden import check_golden


def test_escaping_of_properties_and_message() -> None:
    """A carriage return, and no line: the file alone (a column without a line means nothing to
    GitHub); the rest of the escaping is in the golden annotations."""
    line = error_annotation("50%\r", "compose.yml", None, 4)
    assert line == "::error file=compose.yml,title=batch-invariance check-deploy::50%25%0D"


@pytest.mark.parametrize(
    ("file", "workspace", "cwd", "expected"),
    [
        ("/ws/deploy/llm.sh", "/ws", "/ws", "deploy/llm.sh"),  # under the workspace
        ("deploy/llm.sh", "/ws", "/ws", "deploy/llm.sh"),  # relative to the workspace as cwd
        ("/etc/systemd/system/llm.service", "/ws", "/ws", "/etc/systemd/system/llm.service"),
        ("/ws2/llm.sh", "/ws", "/ws", "/ws2/llm.sh"),  # a sibling that only starts like it
        ("/ws/a/../llm.sh", "/ws", "/ws", "llm.sh"),
        # A relative path is read from the working folder.
        ("llm.sh", "/ws", "/ws/deploy", "deploy/llm.sh"),
        ("llm.sh", "/ws", "/elsewhere", "llm.sh"),
        ("llm.sh", None, "/ws", "llm.sh"),
        ("/ws/llm.sh", "", "/", "/ws/llm.sh"),
    ],
)
def test_the_path_is_relative_to_the_workspace_when_under_it(
    file: str, workspace: str | None, cwd: str, expected: str
) -> None:
    assert workspace_path(file, workspace, cwd) == expected


def test_only_a_github_job_gets_annotations_and_a_pass_has_none() -> None:
    assert in_github_job({"GITHUB_ACTIONS": "true"})
    assert not in_github_job({}) and not in_github_job({"GITHUB_ACTIONS": "false"})
    assert deploy_annotations(outcome(checks=(covered(),)), "/ws", "/ws") == ""


def test_annotations_are_golden() -> None:
    """The cells and constructs of :func:`mixed` and :func:`outside`, then the escaping of a
    path with a comma and a colon, a message with a percent sign and a newline."""
    text = deploy_annotations(mixed(), "/ws", "/ws") + deploy_annotations(outside(), "/ws", "/ws")
    text += error_annotation("50% of\nthe cells", "/ws/a,b:c/llm.sh", 2, 5) + "\n"
    check_golden("check_deploy_annotations.txt", text)


def test_the_text_names_each_cell_and_construct() -> None:
    text = deploy_text(mixed())
    assert text.splitlines()[0] == (
        "skip  gemma-3-270m-q4_k_m ctx=1024 N=1 kv=split  [llm.sh:2]  parallel 1: no batching, "
        "no cert needed"
    )
    assert "[llm.sh:4]  promotable cert: gemma-3-270m-q4_k_m__ctx1024__N4.json; " \
        "EnvironmentFile=-/x is absent here\n" in text  # fmt: skip
    assert deploy_text(outside()).splitlines()[0] == (
        "FAIL  not covered: llm.sh:3: not understood: running curl (not in the grammar); "
        "do it elsewhere"
    )
