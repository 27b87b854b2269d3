"""Every deploy reader answers about 1 MB of adversarial input within 10 s as an exit code (issue
40: no hang, ``RecursionError`` or traceback), one that crosses a bound of
:mod:`batch_invariance.deploy.readers.source_bytes` not understood at its file and line."""

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
EXPANDED = "(a $ expansion"
SERVERS = "servers whose command lines and environments hold more than 65536 words"
LAUNCH = "exec /usr/bin/llama-server -m /m/a.gguf -np 2\n"
#: Levels of nesting of one-character brackets in about a megabyte.
DEEP = MB // 2
NESTED = "YAML nested deeper than 64 levels"
Body = Callable[[], str]


def _lines(line: str, size: int = MB) -> str:
    """``line`` repeated to about ``size`` characters."""
    return line * (size // len(line))


def _volumes(count: int, prefix: str, mode: str = "") -> str:
    mounts = "".join(f"      - /{prefix}{i}:/{prefix}c{i}{mode}\n" for i in range(count))
    return "    volumes:\n" + mounts


SHELL: list[tuple[str, Body, str | None]] = [
    ("many-lines", lambda: _lines("x=1\n") + LAUNCH, None),
    ("many-exports", lambda: "".join(f"export V{i}=1\n" for i in range(99000)) + LAUNCH, SERVERS),
    ("long-word", lambda: "x=" + "a" * MB + "\n" + LAUNCH, None),
    ("long-quoted-word", lambda: 'x="' + "a" * MB + '"\n' + LAUNCH, None),
    ("continued-50000-times", lambda: "exec llama-server \\\n" + "-np 2 \\\n" * 50000
     + "-m /m/a.gguf\n", None),
    ("expansions", lambda: "x=" + "a" * 999 + "\necho" + _lines(" $x") + "\n", EXPANDED),
    ("launches", lambda: _lines("llama-server -m /m/a.gguf -np 2\n"), "a second launch"),
    ("here-documents", lambda: _lines(": <<A\nA\n"), "<<A"),
]  # fmt: skip
SYSTEMD: list[tuple[str, Body, str | None]] = [
    ("unit-continued-50000-times", lambda: "ExecStart=/usr/bin/llama-server \\\n"
     + "--parallel 2 \\\n" * 50000 + "-np 2\n", None),
    ("unit-long-line", lambda: "ExecStart=/usr/bin/llama-server" + _lines(" -np 2") + "\n", None),
    ("unit-many-lines", lambda: _lines("Environment=A=1\n") + SERVER, None),
    ("unit-many-lines-refused", lambda: _lines("Bogus=1\n") + SERVER, "Bogus= in [Service]"),
    ("unit-long-value", lambda: f"Environment=A={'a' * MB}\n{SERVER}", None),
    ("unit-expansions", lambda: f"Environment=A={'a' * 99999}\nExecStart=/usr/bin/x"
     + _lines(" $A", 900000) + "\n", EXPANDED),
    ("unit-many-variables", lambda: "".join(f"Environment=V{i}=x\n" for i in range(80000))
     + SERVER, SERVERS),
]  # fmt: skip
COMPOSE: list[tuple[str, Body, str | None]] = [
    ("yaml-flow-sequences", lambda: "services: " + "[" * DEEP + "]" * DEEP + "\n", NESTED),
    ("yaml-flow-mappings", lambda: "services: " + "{a: " * (DEEP // 3) + "b"
     + "}" * (DEEP // 3) + "\n", NESTED),
    ("yaml-block-mappings", lambda: "".join(" " * i + f"k{i}:\n" for i in range(1400)), NESTED),
    ("yaml-block-sequences", lambda: "services:\n  x:\n    command:\n" + "".join(
        " " * (4 + i) + "-\n" for i in range(1400)), NESTED),
    ("yaml-indentless-sequences", lambda: "services:\n" + "".join(
        "  " * i + "- a:\n" for i in range(1000)), NESTED),
    ("many-services", lambda: "services:\n" + "".join(f"  s{i}:\n{IMAGE}    command: "
     '["-m", "/m/a.gguf", "-np", "2"]\n' for i in range(10000)),
     "a server beyond the 64 one deploy may start"),
    ("long-scalar", lambda: 'services:\n  x:\n    image: "' + "a" * MB + '"\n', None),
    ("many-environment-values", lambda: "services:\n  x:\n" + IMAGE + "    environment:\n"
     + "".join(f"      V{i}: x\n" for i in range(40000)), None),
    ("manifest-many-containers", lambda: "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n"
     + "".join(f"  - name: c{i}\n    image: ghcr.io/ggml-org/llama.cpp:server\n    args: "
               "[-m, /m/a.gguf]\n" for i in range(10000)), "a server beyond the 64"),
    ("volumes-against-volumes", lambda: "services:\n  x:\n" + IMAGE + _volumes(20000, "m", ":ro")
     + "  other:\n    image: busybox\n" + _volumes(20000, "n"), None),
    ("path-against-volumes", lambda: "services:\n  x:\n" + IMAGE
     + '    entrypoint: ["llama-server"]\n'
     + '    environment:\n      PATH: "' + ":".join(f"/p{i}" for i in range(60000)) + '"\n'
     + _volumes(20000, "m", ":ro"), None),
]  # fmt: skip
CASES = [
    *((i, "run.sh", "#!/bin/bash\n", body, refused) for i, body, refused in SHELL),
    *((i, "llm.service", "[Service]\n", body, refused) for i, body, refused in SYSTEMD),
    *((i, "compose.yml", "", body, refused) for i, body, refused in COMPOSE),
]


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


@pytest.mark.usefixtures("stopwatch")
@pytest.mark.parametrize(("name", "head", "body", "refused"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_every_reader_answers_a_megabyte_in_bounded_time(
    name: str, head: str, body: Body, refused: str | None, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    (tmp_path / "certs").mkdir()
    (tmp_path / "deploy").mkdir()
    config = tmp_path / "deploy" / name
    config.write_text(head + body())
    start = time.monotonic()
    code = main(["check-deploy", str(config), "--certs", f"{tmp_path}/certs", "--allow-unsigned"])
    took = time.monotonic() - start
    out = "".join(capsys.readouterr())
    assert isinstance(code, int) and code not in (exitcodes.PROMOTABLE, exitcodes.INFRA), out[:2000]
    assert "Traceback" not in out and "unexpected error" not in out, out[:2000]
    assert took < LIMIT_S, f"{took:.1f} s"
    if refused is not None:  # named at its file and line, with the bound it crossed
        named = rf"[^\s:]+:\d+: not understood: [^\n]*{re.escape(refused)}"
        assert re.search(named, out), out[:2000]
