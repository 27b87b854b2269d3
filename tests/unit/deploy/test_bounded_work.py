"""Every deploy reader answers every input in time proportional to its size (issue 40): about
1 MB of adversarial input per case, in each format check-deploy reads (a shell script, a
systemd unit, a compose file, a Kubernetes manifest), must come back within
10 s as an exit code: no hang, no ``RecursionError``, no traceback. An input that crosses one
of the readers' bounds (:mod:`batch_invariance.deploy.readers.source_bytes`) or leaves the
allowlist is *not understood* at its file and line.

Each of these hung the check (minutes), crashed it or took tens of seconds before the bounds:
a unit line continued 50,000 times, YAML nested 10,000 deep, long words, many lines,
values doubled line after line (the readers expand no variables now: a ``$`` is refused).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main

MB = 1_000_000
#: The most one case may take (the issue's bound is 1 s per 100 KB).
LIMIT_S = 10.0
#: Past this a case is stopped (a hang fails the test instead of the suite hanging).
STOP_S = 60
SERVER = "ExecStart=/usr/bin/llama-server -np 2\n"
IMAGE = "    image: ghcr.io/ggml-org/llama.cpp:server\n"

Build = Callable[[Path], Path]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---- shell ------------------------------------------------------------------------------
def _lines(line: str, size: int = MB) -> str:
    """``line`` repeated to about ``size`` characters."""
    return line * (size // len(line))


def _script(body: Callable[[], str]) -> Build:
    return lambda root: _write(root / "run.sh", "#!/bin/bash\n" + body())


EXPANDED = "(a $ expansion"
SERVERS = "servers whose command lines and environments hold more than 65536 words"
LAUNCH = "exec /usr/bin/llama-server -m /m/a.gguf -np 2\n"
SHELL: list[tuple[str, Build, str | None]] = [
    ("many-lines", _script(lambda: _lines("x=1\n") + LAUNCH), None),
    ("many-exports", _script(lambda: "".join(f"export V{i}=1\n" for i in range(99000)) + LAUNCH),
     SERVERS),
    ("long-word", _script(lambda: "x=" + "a" * MB + "\n" + LAUNCH), None),
    ("long-quoted-word", _script(lambda: 'x="' + "a" * MB + '"\n' + LAUNCH), None),
    ("continued-50000-times", _script(lambda: "exec llama-server \\\n" + "-np 2 \\\n" * 50000
                                      + "-m /m/a.gguf\n"), None),
    ("expansions", _script(lambda: "x=" + "a" * 999 + "\necho" + _lines(" $x") + "\n"),
     EXPANDED),
    ("launches", _script(lambda: _lines("llama-server -m /m/a.gguf -np 2\n")), "a second launch"),
    ("here-documents", _script(lambda: _lines(": <<A\nA\n")), "<<A"),
]  # fmt: skip


# ---- systemd ------------------------------------------------------------------------------
def _unit(body: Callable[[], str]) -> Build:
    return lambda root: _write(root / "llm.service", "[Service]\n" + body())


def _variables(count: int) -> str:
    return "".join(f"V{i}=x\n" for i in range(count))


def _continued() -> str:
    return "ExecStart=/usr/bin/llama-server \\\n" + "--parallel 2 \\\n" * 50000 + "-np 2\n"


def _expanded_exec_start() -> str:
    return f"Environment=A={'a' * 99999}\nExecStart=/usr/bin/x{_lines(' $A', 900000)}\n"


SYSTEMD: list[tuple[str, Build, str | None]] = [
    ("unit-continued-50000-times", _unit(_continued), None),
    ("unit-long-line", _unit(lambda: "ExecStart=/usr/bin/llama-server" + _lines(" -np 2") + "\n"),
     None),
    ("unit-many-lines", _unit(lambda: _lines("Environment=A=1\n") + SERVER), None),
    ("unit-many-lines-refused", _unit(lambda: _lines("Bogus=1\n") + SERVER),
     "Bogus= in [Service]"),
    ("unit-long-value", _unit(lambda: f"Environment=A={'a' * MB}\n{SERVER}"), None),
    ("unit-expansions", _unit(_expanded_exec_start), EXPANDED),
    ("unit-many-variables", _unit(lambda: "".join(f"Environment=V{i}=x\n" for i in range(80000))
                                  + SERVER), SERVERS),
]  # fmt: skip


# ---- compose ------------------------------------------------------------------------------
def _compose(text: Callable[[], str]) -> Build:
    return lambda root: _write(root / "compose.yml", text())


def _volumes(count: int, prefix: str, mode: str = "") -> str:
    mounts = "".join(f"      - /{prefix}{i}:/{prefix}c{i}{mode}\n" for i in range(count))
    return "    volumes:\n" + mounts


def _services() -> str:
    service = IMAGE + '    command: ["-m", "/m/a.gguf", "-np", "2"]\n'
    return "services:\n" + "".join(f"  s{i}:\n{service}" for i in range(10000))


def _volumes_against_volumes() -> str:
    other = "  other:\n    image: busybox\n" + _volumes(20000, "n")
    return "services:\n  x:\n" + IMAGE + _volumes(20000, "m", ":ro") + other


def _path_against_volumes() -> str:
    path = ":".join(f"/p{i}" for i in range(60000))
    server = (
        IMAGE + '    entrypoint: ["llama-server"]\n' + f'    environment:\n      PATH: "{path}"\n'
    )
    return "services:\n  x:\n" + server + _volumes(20000, "m", ":ro")


#: Levels of nesting of one-character brackets in about a megabyte.
DEEP = MB // 2
NESTED = "YAML nested deeper than 64 levels"
COMPOSE: list[tuple[str, Build, str | None]] = [
    ("yaml-flow-sequences", _compose(lambda: "services: " + "[" * DEEP + "]" * DEEP + "\n"),
     NESTED),
    ("yaml-flow-mappings", _compose(lambda: "services: " + "{a: " * (DEEP // 3) + "b"
                                    + "}" * (DEEP // 3) + "\n"), NESTED),
    ("yaml-block-mappings", _compose(lambda: "".join(" " * i + f"k{i}:\n" for i in range(1400))),
     NESTED),
    ("yaml-block-sequences", _compose(lambda: "services:\n  x:\n    command:\n" + "".join(
        " " * (4 + i) + "-\n" for i in range(1400))), NESTED),
    ("yaml-indentless-sequences", _compose(lambda: "services:\n" + "".join(
        "  " * i + "- a:\n" for i in range(1000))), NESTED),
    ("many-services", _compose(_services), "a server beyond the 64 one deploy may start"),
    ("long-scalar", _compose(lambda: 'services:\n  x:\n    image: "' + "a" * MB + '"\n'), None),
    ("many-environment-values", _compose(lambda: "services:\n  x:\n" + IMAGE
                                         + "    environment:\n" + "".join(
        f"      V{i}: x\n" for i in range(40000))), None),
    ("manifest-many-containers", _compose(lambda: "apiVersion: v1\nkind: Pod\nspec:\n"
                                          "  containers:\n" + "".join(
        f"  - name: c{i}\n    image: ghcr.io/ggml-org/llama.cpp:server\n    args: [-m, /m/a.gguf]\n"
        for i in range(10000))), "a server beyond the 64"),
    ("volumes-against-volumes", _compose(_volumes_against_volumes), None),
    ("path-against-volumes", _compose(_path_against_volumes), None),
]  # fmt: skip


CASES = [*SHELL, *SYSTEMD, *COMPOSE]


class _Hung(BaseException):
    """A case ran past :data:`STOP_S` (not an ``Exception``: the CLI must not answer it)."""


@pytest.fixture
def stopwatch() -> Iterator[None]:
    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Hung(f"still running after {STOP_S} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(STOP_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(("build", "refused"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_reader_answers_a_megabyte_in_bounded_time(
    build: Build,
    refused: str | None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    stopwatch: None,
) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    config = build(tmp_path / "deploy")
    start = time.monotonic()
    code = main(["check-deploy", str(config), "--certs", str(certs), "--allow-unsigned"])
    took = time.monotonic() - start
    said = capsys.readouterr()
    out = said.out + said.err
    assert isinstance(code, int) and code not in (exitcodes.PROMOTABLE, exitcodes.INFRA), out[:2000]
    assert "Traceback" not in out and "unexpected error" not in out, out[:2000]
    assert took < LIMIT_S, f"{took:.1f} s"
    if refused is not None:  # named at its file and line, with the bound it crossed
        named = rf"[^\s:]+:\d+: not understood: [^\n]*{re.escape(refused)}"
        assert re.search(named, out), out[:2000]
