"""Every deploy reader answers every input in time proportional to its size (issue 40): about
1 MB of adversarial input per case, in each format check-deploy reads (a shell script and the
files it sources, a systemd unit, the environment file it names with ``EnvironmentFile=``, a
compose file, a ``models.toml``), must come back within 10 s as an exit code: no hang, no
``RecursionError``, no traceback. An input that crosses one of the readers' bounds
(:mod:`batch_invariance.deploy.readers.bounds`) is *not understood* at its file and line,
naming the bound.

Each of these hung the check (minutes), crashed it or took tens of seconds before the bounds:
``.`` of files that source each other thousands of times, a unit line continued 50,000 times,
YAML and TOML nested 10,000 deep, long words, many lines, values doubled line after line.
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


def _sourced_fan_out(root: Path) -> Path:
    # f0 sources f1 4,000 times, f1 sources f2 4,000 times ...: 4,000^4 statements.
    for level in range(4):
        _write(root / f"f{level}.sh", f". {root}/f{level + 1}.sh\n" * 4000)
    _write(root / "f4.sh", "X=1\n")
    return _write(root / "run.sh", "#!/bin/bash\n" + f". {root}/f0.sh\n" * 4000)


def _sourced_mutually(root: Path) -> Path:
    _write(root / "a.sh", f". {root}/b.sh\n" * 2 + "X=1\n")
    _write(root / "b.sh", f". {root}/a.sh\n" * 2 + "Y=1\n")
    return _write(root / "run.sh", "#!/bin/bash\n" + _lines(f". {root}/a.sh\n"))


def _sourced_thousands_of_times(root: Path) -> Path:
    _write(root / "one.sh", "X=1\n")
    return _write(root / "run.sh", "#!/bin/bash\n" + _lines(f". {root}/one.sh\n"))


def _writes_and_sourcings(root: Path) -> Path:
    _write(root / "one.sh", "X=1\n")
    body = _lines(f"mkdir -p {root}/logs\n", MB // 2) + _lines(f". {root}/one.sh\n", MB // 2)
    return _write(root / "run.sh", "#!/bin/bash\n" + body)


def _launches(root: Path) -> Path:
    launch = "/usr/bin/llama-server -m /m/a.gguf -np 2 &\n"
    return _write(root / "run.sh", "#!/bin/bash\nexport PATH=/usr/bin\n" + _lines(launch))


def _launches_over_many_variables(root: Path) -> Path:
    assigned = "".join(f"V{i}=1\n" for i in range(99900))
    launch = "llama-server -m /m/a.gguf -np 2 &\n"
    return _write(root / "run.sh", "#!/bin/bash\n" + assigned + launch * 64)


def _many_variables_to_many_servers(root: Path) -> Path:
    exports = "".join(f"export V{i}=1\n" for i in range(99900))
    launch = "/usr/bin/llama-server -m /m/a.gguf -np 2 &\n"
    return _write(root / "run.sh", "#!/bin/bash\nexport PATH=/usr/bin\n" + exports + launch * 64)


def _script(body: Callable[[], str]) -> Build:
    return lambda root: _write(root / "run.sh", "#!/bin/bash\n" + body())


def _chain() -> str:
    return "V0=a\n" + "".join(f"V{i + 1}=$V{i}\n" for i in range(60000))


EXPANDED = "expand to more than 16777216 characters"
SERVERS = "servers whose command lines and environments hold more than 65536 words"
SHELL: list[tuple[str, Build, str | None]] = [
    ("sourced-fan-out", _sourced_fan_out, "more than 100000 statements run"),
    ("sourced-mutually", _sourced_mutually, "at most 8 files deep"),
    ("sourced-thousands-of-times", _sourced_thousands_of_times, None),
    ("writes-and-sourcings", _writes_and_sourcings, None),
    ("launches", _launches, "a server beyond the 64 one deploy may start"),
    ("launches-over-many-variables", _launches_over_many_variables, None),
    ("many-variables-to-many-servers", _many_variables_to_many_servers, SERVERS),
    ("long-word", _script(lambda: "X=" + "a" * MB + "\n"), None),
    ("long-escaped-word", _script(lambda: "X=" + "\\a" * (MB // 2) + "\n"), None),
    ("long-quoted-word", _script(lambda: 'X="' + "a" * MB + '"\n'), None),
    ("many-lines", _script(lambda: _lines("X=1\n")), "more than 100000 statements run"),
    ("assignment-chain", _script(_chain), None),
    ("doubling", _script(lambda: "X=ab\n" + "X=$X$X\n" * 60), EXPANDED),
    ("long-value-expanded", _script(lambda: "X=" + "a" * 99999 + "\n" + _lines("Y=$X$X\n")),
     EXPANDED),
    ("many-expansions", _script(lambda: "X=" + "a" * 999 + "\necho" + _lines(" $X") + "\n"),
     EXPANDED),
    ("here-documents", _script(lambda: _lines(": <<A\nA\n")), "a here-document"),
    ("here-document-operators", _script(lambda: _lines("x <<A ") + "\n"), "a here-document"),
]  # fmt: skip


# ---- systemd, and the environment file a unit names ---------------------------------------
def _unit(body: Callable[[], str]) -> Build:
    return lambda root: _write(root / "llm.service", "[Service]\n" + body())


def _env_file(text: Callable[[], str], times: int = 1) -> Build:
    def build(root: Path) -> Path:
        env = _write(root / "llm.env", text())
        named = f"EnvironmentFile={env}\n" * times
        return _write(root / "llm.service", "[Service]\n" + named + SERVER)

    return build


def _variables(count: int) -> str:
    return "".join(f"V{i}=x\n" for i in range(count))


def _continued() -> str:
    return "ExecStart=/usr/bin/llama-server \\\n" + "--parallel 2 \\\n" * 50000 + "-np 2\n"


def _many_words() -> str:
    return f'Environment="A={"a " * 200000}a"\nExecStart=/usr/bin/llama-server{" $A" * 30}\n'


def _expanded_exec_start() -> str:
    return f"Environment=A={'a' * 99999}\nExecStart=/usr/bin/x{_lines(' $A', 900000)}\n"


SYSTEMD: list[tuple[str, Build, str | None]] = [
    ("unit-continued-50000-times", _unit(_continued), None),
    ("unit-long-line", _unit(lambda: "ExecStart=/usr/bin/llama-server" + _lines(" -np 2") + "\n"),
     None),
    ("unit-many-lines", _unit(lambda: _lines("Environment=A=1\n") + SERVER), None),
    ("unit-many-lines-refused", _unit(lambda: _lines("Bogus=1\n") + SERVER),
     "Bogus= in [Service]"),
    ("unit-long-value", _unit(lambda: f"Environment=A={'a' * MB}\nExecStart=/usr/bin/x ${{A}}\n"),
     None),
    ("unit-value-split-into-many-words", _unit(_many_words), SERVERS),
    ("unit-value-expanded", _unit(_expanded_exec_start),
     "ExecStart= expanding to more than 16777216 characters"),
    ("env-file-many-lines", _env_file(lambda: _variables(MB // 10)), None),
    ("env-file-many-lines-refused", _env_file(lambda: _lines("export A=1\n")),
     "environment line 'export A=1'"),
    ("env-file-long-value", _env_file(lambda: "A=" + "a" * MB + "\n"), None),
    ("env-file-named-2000-times", _env_file(lambda: _variables(50000), 2000), None),
]  # fmt: skip


# ---- compose ------------------------------------------------------------------------------
def _compose(text: Callable[[], str]) -> Build:
    return lambda root: _write(root / "compose.yml", text())


def _volumes(count: int, prefix: str, mode: str = "") -> str:
    mounts = "".join(f"      - /{prefix}{i}:/{prefix}c{i}{mode}\n" for i in range(count))
    return "    volumes:\n" + mounts


def _env_file_named_2000_times(root: Path) -> Path:
    env = _write(root / "llm.env", _variables(50000))
    text = "services:\n  x:\n" + IMAGE + "    env_file:\n" + f"      - {env}\n" * 2000
    return _write(root / "compose.yml", text)


def _env_file_to_many_servers(root: Path) -> Path:
    env = _write(root / "llm.env", _variables(100000))
    service = IMAGE + f"    env_file: [{env}]\n"
    return _write(root / "compose.yml", "services:\n" + "".join(
        f"  s{i}:\n{service}" for i in range(64)))  # fmt: skip


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
    ("compose-env-file-named-2000-times", _env_file_named_2000_times, None),
    ("compose-env-file-to-many-servers", _env_file_to_many_servers, SERVERS),
    ("volumes-against-volumes", _compose(_volumes_against_volumes), None),
    ("path-against-volumes", _compose(_path_against_volumes), None),
]  # fmt: skip


# ---- models.toml --------------------------------------------------------------------------
def _toml(text: Callable[[], str]) -> Build:
    return lambda root: _write(root / "models.toml", text())


def _models() -> str:
    row = '[[models]]\nalias = "m{0}"\ngguf = "/m/a{0}.gguf"\nkv = "f16"\n'
    return "".join(row.format(i) for i in range(20000))


TOML_NESTED = "arrays or inline tables nested deeper than 64 levels"
TOML: list[tuple[str, Build, str | None]] = [
    ("toml-nested-arrays", _toml(lambda: "[defaults]\nserver_flags = " + "[" * DEEP
                                 + "]" * DEEP + "\n"), TOML_NESTED),
    ("toml-nested-inline-tables", _toml(lambda: "x = " + "{a = " * (DEEP // 3) + "1"
                                        + "}" * (DEEP // 3) + "\n"), TOML_NESTED),
    ("toml-many-models", _toml(_models), "a server beyond the 64 one deploy may start"),
    ("toml-long-string", _toml(lambda: f'[[models]]\nalias = "{"a" * MB}"\ngguf = "/m/a.gguf"\n'
                               'kv = "f16"\n'), None),
]  # fmt: skip

CASES = [*SHELL, *SYSTEMD, *COMPOSE, *TOML]


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
