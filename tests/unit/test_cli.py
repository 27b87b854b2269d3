"""cli.main: how errors become one line and an exit code."""

from __future__ import annotations

import argparse

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import COMMAND_MODULES, TRACEBACK_ENV, build_parser, command_module, main
from batch_invariance.errors import CertInvalid


def _parser(fault: BaseException) -> argparse.ArgumentParser:
    """A one-command parser whose handler raises ``fault``."""

    def handler(args: argparse.Namespace) -> int:
        raise fault

    parser = argparse.ArgumentParser(prog="batch-invariance")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("boom").set_defaults(func=handler)
    return parser


def test_an_unexpected_error_is_one_line_and_exit_4(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    code = main(["boom"], parser=_parser(RuntimeError("first line\nsecond line")))
    err = capsys.readouterr().err
    assert code == exitcodes.INFRA
    assert len(err.strip().splitlines()) == 1
    assert "RuntimeError: first line second line" in err and "Traceback" not in err
    assert TRACEBACK_ENV in err


def test_the_traceback_env_lets_a_bug_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with pytest.raises(RuntimeError, match="bug"):
        main(["boom"], parser=_parser(RuntimeError("bug")))


def test_known_kinds_keep_their_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["boom"], parser=_parser(CertInvalid("tampered"))) == exitcodes.CERT_INVALID
    assert "error [CertInvalid]: tampered" in capsys.readouterr().err
    assert main(["boom"], parser=_parser(KeyboardInterrupt())) == exitcodes.SIGINT


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> list[tuple[object, ...]]:
    return [
        (tuple(a.option_strings), a.dest, a.default, a.nargs, a.choices, a.required)
        for a in parser._actions
    ]


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_a_command_alone_parses_as_in_the_whole_command_line(module: str) -> None:
    name = module.replace("_", "-")
    alone = _subparsers(build_parser(only=name))
    assert list(alone) == [name]
    assert _options(alone[name]) == _options(_subparsers(build_parser())[name])


def test_anything_else_gets_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    everything = [m.replace("_", "-") for m in COMMAND_MODULES]
    for first in (None, "--help", "run_live", "nonsense"):
        assert list(_subparsers(build_parser(only=first))) == everything
    assert command_module("run-live") == "run_live"
    assert command_module("run_live") is None
    assert main(["run_live"]) == exitcodes.USAGE
    assert "invalid choice: 'run_live'" in capsys.readouterr().err
