"""cli.main: how errors become one line and an exit code."""

from __future__ import annotations

import argparse

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import TRACEBACK_ENV, main
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
