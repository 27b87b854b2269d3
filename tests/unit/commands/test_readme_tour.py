"""The README's offline tour says what check-deploy answers: its deploy line, run as written
in a fresh folder against the shipped certs, fails (exit 3) as a server started directly,
naming the cert that agrees with its cell and the serve line that would pass."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from tests.support.paths import REPO


def _tour() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## A 60-second tour, offline.*?```bash\n(.*?)```", text, re.S)
    assert block is not None, "README.md lost its tour"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines()]


def test_the_tours_check_deploy_says_what_the_readme_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _tour()
    printf = next(line for line in lines if line.startswith("printf "))
    check = next(line for line in lines if line.startswith("batch-invariance check-deploy"))
    words = shlex.split(printf.split(" > ")[0])
    deploy = tmp_path / printf.split(" > ")[1].strip()
    deploy.parent.mkdir(parents=True)
    deploy.write_text(words[1].encode().decode("unicode_escape"))
    args = shlex.split(check)[1:]
    args[args.index("--certs") + 1] = str(REPO / args[args.index("--certs") + 1])
    monkeypatch.chdir(tmp_path)
    assert main(args) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert "ctx=256 N=4" in out and "directly, which is never a pass" in out
    assert "cert gemma-3-270m-q4_k_m__ctx256__N4.json agrees on everything checkable" in out
    assert "not found here" in out and "start it as: batch-invariance serve --certs" in out
