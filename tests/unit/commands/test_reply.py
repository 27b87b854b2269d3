"""``--json`` in cli.main: one canonical object on stdout, for an outcome or an error, with the
exit code the command has without it; human lines go to stderr."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import COMMAND_MODULES, build_parser, main
from batch_invariance.commands.reply import (
    JSON_COMMANDS,
    JSON_DEST,
    ErrorReply,
    add_json_option,
    json_in_argv,
    reply_text,
)
from batch_invariance.errors import InfraError, UsageError
from tests.support.golden import check_golden


def _parser(handler: Callable[[argparse.Namespace], Any]) -> argparse.ArgumentParser:
    """A one-command parser (``boom [--json]``) whose handler is ``handler``."""
    parser = argparse.ArgumentParser(prog="batch-invariance")
    sub = parser.add_subparsers(dest="command", required=True)
    boom = sub.add_parser("boom")
    add_json_option(boom, "what boom did")
    boom.set_defaults(func=handler)
    return parser


def _raises(fault: BaseException) -> Callable[[argparse.Namespace], Any]:
    def handler(args: argparse.Namespace) -> int:
        print("a human line")
        raise fault

    return handler


def _one_object(out: str) -> dict[str, Any]:
    data = json.loads(out)  # the whole of stdout is one JSON document
    assert isinstance(data, dict)
    assert out == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return data


@pytest.mark.parametrize("command", sorted(JSON_COMMANDS))
def test_each_json_command_takes_the_option(command: str) -> None:
    (parser,) = (
        a.choices[command]
        for a in build_parser(only=command)._actions
        if isinstance(a, argparse._SubParsersAction)
    )
    (option,) = (a for a in parser._actions if "--json" in a.option_strings)
    assert option.dest == JSON_DEST
    assert command.replace("-", "_") in COMMAND_MODULES


def test_the_options_own_argv_is_read_only_for_json_commands() -> None:
    assert json_in_argv(["check-deploy", "x", "--json"])
    assert not json_in_argv(["compare", "a", "b", "--json"])  # compare's --json is its own
    assert not json_in_argv(["--json"]) and not json_in_argv([])


@pytest.mark.parametrize(
    ("fault", "code", "kind"),
    [
        (UsageError("bad flag; fix it"), exitcodes.USAGE, "UsageError"),
        (InfraError("server died"), exitcodes.INFRA, "InfraError"),
        (KeyboardInterrupt(), exitcodes.SIGINT, "Interrupted"),
        (RuntimeError("a bug"), exitcodes.INFRA, "unexpected"),
    ],
)
def test_an_error_is_one_object_on_stdout_and_one_line_on_stderr(
    fault: BaseException, code: int, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["boom"], parser=_parser(_raises(fault))) == code
    plain = capsys.readouterr()
    assert main(["boom", "--json"], parser=_parser(_raises(fault))) == code
    out, err = capsys.readouterr()
    error = _one_object(out)["error"]
    assert error["exit_code"] == code and error["kind"] == kind
    # stderr: the human line the handler printed, then the same one line as without --json.
    assert err.splitlines() == ["a human line", plain.err.strip()]
    assert plain.out == "a human line\n"


def test_a_usage_error_before_the_command_runs_is_answered_in_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check-deploy", "deploy.sh", "--json"]) == exitcodes.USAGE
    out, err = capsys.readouterr()
    assert "required: --certs" in _one_object(out)["error"]["message"]
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["run-live", "sweep"])
def test_json_and_dry_run_are_refused_together(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--parallel", "2", "--dry-run", "--json"]) == exitcodes.USAGE
    assert "drop one" in _one_object(capsys.readouterr().out)["error"]["message"]


def test_a_handler_that_returns_a_code_gets_an_object_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def handler(args: argparse.Namespace) -> int:
        print("human")
        return 3

    assert main(["boom", "--json"], parser=_parser(handler)) == 3
    out, err = capsys.readouterr()
    assert _one_object(out) == {"exit_code": 3} and err == "human\n"


def test_the_error_object_is_golden() -> None:
    reply = ErrorReply("--certs x: no such folder; pass the folder", "UsageError", 2)
    check_golden("json_error.json", reply_text(reply))
