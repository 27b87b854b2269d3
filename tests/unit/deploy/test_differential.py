"""Differential tests against the real programs (issue 32, part 8): deploys drawn from a byte
alphabet that includes what Python and the programs read differently, replayed under real
``bash`` and real ``dash``, and units under ``systemd-analyze verify``.

* The alphabet: printable ASCII, quotes, backslashes, ``~``, ``#``, ``*``, ``$``, tab; the
  Unicode blanks U+00A0, U+2003, U+3000, U+0085 (Python's ``split()`` splits at them, the
  shells and systemd do not); the control bytes VT, FF, CR, NUL, ESC, DEL and an invalid UTF-8
  byte; and numbers in the forms ``4 +4 04 0x10 4_0 1e3 -1``. They land in words, between
  words (as separators) and in the ``-np`` value.
* Every deploy the reader accepts is run: with the dialect its ``#!`` line picks (bash:
  ``bash``; sh or no ``#!``: both ``bash`` and ``dash``, the grammar they agree on), under
  ``strace`` when it can trace here. A recording stub ``llama-server`` writes its argv, its
  environment, the executable it was started as and its working folder; these must equal
  what the reader says the server gets. What is recorded of "every file opened": the files
  the *shell* opens (from ``strace``: sourced files read, output files written), compared with
  the reader's sourced and written files; opens of the loader, libc, locale data, ``/proc``,
  ``/dev`` and the stub's own interpreter are left out, and the server's own opens are not
  recorded (the stub is not llama-server; which files llama-server opens is in
  ``test_check_deploy.py`` / ``test_run_time_files.py``: the model, its config files).
  Without ``strace`` only the stub's recording is compared.
* A deploy that holds any byte outside the reader's set is refused, whatever the programs do.
* The ``-np`` value the server really got is understood exactly when it is canonical
  decimal: llama-server's ``std::stoi`` reading is compared with the C++ function in
  ``tests/unit/engines/llama_server/test_option_values.py``.
* systemd: ``systemd-analyze verify`` (offline; no systemd as PID 1 is needed) is clean for
  every unit the reader accepts, and shows that systemd keeps a Unicode blank inside a word.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from batch_invariance.deploy.readers.commands import ServerCommand
from batch_invariance.deploy.readers.config import read_deploy_file
from batch_invariance.deploy.readers.shell import ShellReader
from batch_invariance.deploy.readers.shell_dialect import script_dialect
from batch_invariance.deploy.readers.source_bytes import ALLOWED, read_source
from batch_invariance.engines.llama_server.flags import FlagError, read_flags

BASH, DASH = shutil.which("bash"), shutil.which("dash")
STRACE, ANALYZE = shutil.which("strace"), shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(BASH is None or DASH is None, reason="bash or dash missing")

#: Variables the shells put in every child's environment themselves (not the file's).
SHELL_ADDS = frozenset({"PWD", "SHLVL", "_", "OLDPWD"})
STUB = """#!/usr/bin/python3 -S
import json, os, sys
raw = open("/proc/self/environ", "rb").read().split(b"\\0")
env = dict(e.decode("latin-1").split("=", 1) for e in raw if e)
argv = [os.fsencode(a).decode("latin-1") for a in sys.argv[1:]]
json.dump({"argv": argv, "exe": os.path.realpath(sys.argv[0]), "cwd": os.getcwd(),
           "env": env}, open(os.environ.get("REC_FILE") or "/dev/null", "w"))
"""
UNICODE_BLANKS = ["\u00a0", "\u2003", "\u3000", "\u0085"]
CONTROL = ["\x0b", "\x0c", "\r", "\x00", "\x1b", "\x7f", "\udcff"]  # \udcff: the byte 0xff
NUMBERS = ["4", "+4", "04", "0x10", "4_0", "1e3", "-1", "8"]
PLAIN = list("abcxyz0189-_./:=,@%+")
SPECIAL = ["~", "#", " ", "\t", "*", "$", "\\", "'", '"', "{a,b}", "~root"]
SHEBANGS = ["#!/bin/bash\n", "#!/bin/sh\n", "#!/usr/bin/env bash\n", "#!/usr/bin/env dash\n", ""]
NAMES = ("NP", "MODEL", "EXTRA", "LLAMA_ARG_UBATCH", "GGML_X")
CANONICAL = re.compile(r"0|-?[1-9][0-9]*")


@dataclass(frozen=True)
class World:
    root: Path
    bin: Path
    env_file: Path
    folder: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("differential")
    stub = root / "bin" / "llama-server"
    stub.parent.mkdir()
    stub.write_text(STUB)
    stub.chmod(0o755)
    env_file = root / "env.sh"
    env_file.write_text("export LLAMA_ARG_UBATCH=1\nEXTRA=from-env\n")
    (root / "work").mkdir()
    return World(root, stub.parent, env_file, root / "work")


# ---- drawing deploys ---------------------------------------------------------------------

CLEAN_ATOMS = st.one_of(
    st.sampled_from(PLAIN), st.sampled_from(PLAIN), st.sampled_from(NUMBERS),
    st.sampled_from(SPECIAL),
)  # fmt: skip
#: A third of the deploys also draw the bytes outside the set (each one is refused).
ATOMS = st.one_of(CLEAN_ATOMS, st.sampled_from(UNICODE_BLANKS + CONTROL))


def _quote(text: str, how: str) -> str:
    if how == "single":
        return f"'{text}'"
    if how == "double":
        return '"' + "".join("\\" + c if c in '"\\$`' else c for c in text) + '"'
    if how == "backslash":
        return "".join("\\" + c for c in text)
    return text


@st.composite
def words(draw: st.DrawFn, dirty: bool = False) -> str:
    """One shell word from the alphabet: atoms, each quoted one way (or not at all)."""
    atoms = ATOMS if dirty else CLEAN_ATOMS
    pieces = draw(st.lists(st.tuples(atoms, st.sampled_from(["bare", "single", "double",
                                                              "backslash"])),
                           min_size=1, max_size=4))  # fmt: skip
    return "".join(_quote(text, how) for text, how in pieces)


SEPARATORS = st.sampled_from([" ", " ", "\t"])
DIRTY_SEPARATORS = st.one_of(SEPARATORS, st.sampled_from(UNICODE_BLANKS))


@st.composite
def deploys(draw: st.DrawFn, world: World) -> str:
    dirty = draw(st.integers(0, 2)) == 0
    separators = DIRTY_SEPARATORS if dirty else SEPARATORS
    lines = [draw(st.sampled_from(SHEBANGS)).rstrip("\n")]
    lines.append(draw(st.sampled_from(["", "set -e", "set -eu"])))
    lines.append(f"export PATH={world.bin}:/usr/bin:/bin")
    if draw(st.booleans()):
        lines.append(f". {world.env_file}")
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(NAMES))
        lines.append(f"export {name}={draw(words(dirty))}")
    if draw(st.booleans()):
        lines.append(f"cd {world.folder} || exit 1")
    if draw(st.booleans()):
        lines.append(f"echo starting >> {world.root}/llm.log")
    launch: list[str] = []
    if draw(st.booleans()):
        launch.append("exec")
    if draw(st.booleans()):
        launch += ["/usr/bin/env", "-i", f"PATH={world.bin}:/usr/bin", f"REC_FILE={world.root}/r"]
    launch += ["llama-server", "-np", draw(st.sampled_from(NUMBERS))]
    launch += draw(st.lists(words(dirty), max_size=4))
    if draw(st.booleans()):
        launch.append(f"> {world.root}/server.log 2>&1")
    lines.append("".join(w + draw(separators) for w in launch).rstrip(" \t"))
    return "\n".join(lines) + "\n"


# ---- running them ------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    recorded: dict[str, object]
    #: Files the shell opened to read and to write (``None``: not traced here).
    read: set[str] | None
    written: set[str] | None


_OPEN = re.compile(r'^\d+\s+openat\(AT_FDCWD, "([^"]*)", ([A-Z_|]+)(?:, \d+)?\) = \d+', re.M)
_SYSTEM = ("/etc/", "/lib", "/usr/lib", "/usr/share/", "/proc/", "/dev/", "/sys/")


def _can_trace() -> bool:
    if STRACE is None:
        return False
    done = subprocess.run([STRACE, "-qq", "-o", "/dev/null", "true"], capture_output=True,
                          timeout=30, check=False)  # fmt: skip
    return done.returncode == 0


TRACE = _can_trace()


def _opens(trace: str, world: World, script: Path) -> tuple[set[str], set[str]]:
    read: set[str] = set()
    written: set[str] = set()
    skip = {str(script), str(world.root / "r"), str(world.bin / "llama-server")}
    for path, flags in _OPEN.findall(trace):
        if path.startswith(_SYSTEM) or path in skip or "O_DIRECTORY" in flags:
            continue
        (written if "O_WRONLY" in flags or "O_RDWR" in flags else read).add(path)
    return read, written


def _run(shell: str, world: World, text: bytes) -> Run:
    script = world.root / "deploy.sh"
    script.write_bytes(text)
    record = world.root / "r"
    record.unlink(missing_ok=True)
    trace = world.root / "trace"
    prefix = [STRACE, "-f", "-qq", "-e", "trace=openat", "-o", str(trace)] if TRACE else []
    done = subprocess.run([*prefix, shell, str(script)], env={"REC_FILE": str(record)},  # type: ignore[list-item]
                          cwd=world.root, capture_output=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0, (shell, done.stderr)
    recorded: dict[str, object] = json.loads(record.read_text())
    if not TRACE:
        return Run(recorded, None, None)
    read, written = _opens(trace.read_text(errors="replace"), world, script)
    return Run(recorded, read, written)


def _expected_program(command: ServerCommand) -> str:
    program = command.argv[0]
    if "/" not in program:
        search = command.env.get("PATH") if command.search_path is None else command.search_path
        found = shutil.which(program, path=search)
        assert found is not None
        program = found
    return os.path.realpath(program)


def _read(world: World, text: str) -> tuple[ShellReader | None, tuple[ServerCommand, ...]]:
    """The reader's view (``None``: not understood), from the file's bytes as check-deploy
    reads them."""
    data = text.encode("utf-8", "surrogateescape")
    script = world.root / "deploy.sh"
    script.write_bytes(data)
    read = read_deploy_file(script)
    if read.not_understood:
        return None, ()
    choice = script_dialect(text)
    assert choice.dialect is not None
    reader = ShellReader("deploy.sh", lambda f: read_source(Path(f), f), choice.dialect)
    reader.run(text)
    return reader, read.commands


def _compare(world: World, reader: ShellReader, command: ServerCommand, run: Run) -> None:
    seen = run.recorded
    assert seen["argv"] == list(command.argv[1:])
    assert seen["exe"] == _expected_program(command)
    env = {k: v for k, v in dict(seen["env"]).items() if k not in SHELL_ADDS}  # type: ignore[call-overload]
    env.pop("REC_FILE", None)
    assert env == {k: v for k, v in command.env.items() if k != "REC_FILE"}
    assert seen["cwd"] == str(command.base_dir or world.root)
    if run.read is not None and run.written is not None:
        assert run.read == {a.path for a in reader.sourced}
        outputs = {a.path for a in reader.written if a.kind == "output"}
        assert run.written == outputs


def _numbers_as_the_server_reads_them(command: ServerCommand) -> None:
    """The ``-np`` and ``LLAMA_ARG_UBATCH`` values the server got are understood exactly when
    they are canonical decimal."""
    value = command.argv[command.argv.index("-np") + 1]
    try:
        read_flags(command.argv, {}, first_is_binary=True)
    except FlagError as exc:
        if str(exc).startswith("-np "):
            assert not CANONICAL.fullmatch(value), exc
        return
    assert CANONICAL.fullmatch(value), f"-np {value!r} understood"
    ubatch = command.env.get("LLAMA_ARG_UBATCH")
    if ubatch is not None:  # a number from the environment, as the server reads it
        try:
            read_flags(["llama-server"], {"LLAMA_ARG_UBATCH": ubatch}, first_is_binary=True)
        except FlagError:
            assert not CANONICAL.fullmatch(ubatch)
        else:
            assert CANONICAL.fullmatch(ubatch), f"LLAMA_ARG_UBATCH={ubatch!r} understood"


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_every_accepted_deploy_runs_as_read_under_bash_and_dash(
    world: World, data: st.DataObject
) -> None:
    text = data.draw(deploys(world))
    reader, commands = _read(world, text)
    raw = text.encode("utf-8", "surrogateescape")
    if any(byte not in ALLOWED for byte in raw):
        event("a byte outside the set: refused")
        assert reader is None, f"accepted a byte outside the set: {raw!r}"
        return
    if reader is None:
        event("outside the grammar: refused")
        return  # refused (a word outside the grammar): nothing runs it as read
    event(f"accepted: replayed ({reader.dialect})")
    (command,) = commands
    _numbers_as_the_server_reads_them(command)
    shells = [BASH] if reader.dialect == "bash" else [BASH, DASH]
    for shell in shells:
        assert shell is not None
        _compare(world, reader, command, _run(shell, world, raw))


def test_the_alphabet_reaches_the_reader_and_some_deploys_pass(world: World) -> None:
    """Not vacuous: deploys with quoted ``~``, ``#``, ``*``, blanks and every number form are
    accepted and replayed (the property above draws them; these are fixed witnesses)."""
    text = (
        f"#!/bin/sh\nset -e\nexport PATH={world.bin}:/usr/bin:/bin\n. {world.env_file}\n"
        f"export EXTRA='~/a b' MODEL=\"x#y*\" NP=\\~root\ncd {world.folder} || exit 1\n"
        f"echo starting >> {world.root}/llm.log\n"
        f'exec llama-server -np +4 "$EXTRA" $EXTRA \'1e3\' 0x10\t4_0 04 "$MODEL" $NP'
        f" > {world.root}/server.log 2>&1\n"
    )
    reader, (command,) = _read(world, text)
    assert reader is not None
    assert command.argv[1:4] == ("-np", "+4", "~/a b")
    with pytest.raises(FlagError):
        read_flags(command.argv, {}, first_is_binary=True)
    logs = {f"{world.root}/llm.log", f"{world.root}/server.log"}
    for shell in (BASH, DASH):
        assert shell is not None
        run = _run(shell, world, text.encode())
        _compare(world, reader, command, run)
        if TRACE:  # the trace saw the shell source the file and open the logs
            assert run.read == {str(world.env_file)} and run.written == logs


@pytest.mark.parametrize("line", ["export NP=$'a'", "NP=$'a'", "NP=$'a' llama-server -np 4"])
def test_ansi_c_quoting_in_an_assignment_is_not_understood(world: World, line: str) -> None:
    """Found by the property above: the value of ``NP=$'a'`` was read as empty; bash reads
    ``a`` (and dash ``$a``)."""
    text = f"#!/bin/bash\nexport PATH={world.bin}:/usr/bin:/bin\n{line}\nllama-server -np 4\n"
    assert _read(world, text)[0] is None
    assert BASH is not None
    shown = f"export PATH={world.bin}:/usr/bin:/bin\nexport NP=$'a'\nllama-server -np 4\n"
    seen = _run(BASH, world, shown.encode()).recorded
    assert dict(seen["env"])["NP"] == "a"  # type: ignore[call-overload]


@pytest.mark.parametrize("blank", UNICODE_BLANKS)
def test_a_unicode_blank_is_part_of_a_word_in_both_shells(world: World, blank: str) -> None:
    """Why the byte set holds: bash and dash keep U+00A0 (and its kin) inside a word, where
    Python's split() would cut it; the reader refuses the line."""
    text = f"export PATH={world.bin}:/usr/bin:/bin\nllama-server -np{blank}4 x\n"
    assert _read(world, text)[0] is None
    for shell in (BASH, DASH):
        assert shell is not None
        seen = _run(shell, world, text.encode()).recorded
        assert seen["argv"] == [f"-np{blank}4".encode().decode("latin-1"), "x"]


# ---- systemd -----------------------------------------------------------------------------


def _analyze_works() -> bool:
    """``systemd-analyze verify`` loads a clean unit and flags a bad key here (it needs no
    systemd as PID 1, but some containers lack what it loads)."""
    if ANALYZE is None:
        return False
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        unit = Path(folder) / "probe.service"
        unit.write_text("[Service]\nExecStart=/bin/true\n")
        clean = subprocess.run([ANALYZE, "verify", "--man=no", str(unit)],
                               capture_output=True, timeout=60, check=False)  # fmt: skip
        unit.write_text("[Service]\nExecStart=/bin/true\nBogusKey=1\n")
        bad = subprocess.run([ANALYZE, "verify", "--man=no", str(unit)],
                             capture_output=True, timeout=60, check=False)  # fmt: skip
    return clean.returncode == 0 and b"BogusKey" in bad.stdout + bad.stderr


needs_analyze = pytest.mark.skipif(
    not _analyze_works(), reason="systemd-analyze verify cannot run here"
)


def _verify(unit: Path) -> str:
    assert ANALYZE is not None
    done = subprocess.run([ANALYZE, "verify", "--man=no", str(unit)], capture_output=True,
                          timeout=60, check=False)  # fmt: skip
    return (done.stdout + done.stderr).decode("utf-8", "replace")


@st.composite
def unit_values(draw: st.DrawFn, dirty: bool) -> str:
    atoms = st.one_of(st.sampled_from(PLAIN), st.sampled_from(PLAIN), st.sampled_from(NUMBERS),
                      st.sampled_from(['"', "\\", "$", "%", "#", " "]))  # fmt: skip
    if dirty:
        atoms = st.one_of(atoms, st.sampled_from(UNICODE_BLANKS + CONTROL))
    return "".join(draw(st.lists(atoms, min_size=1, max_size=5)))


@needs_analyze
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_units_the_reader_accepts_are_clean_under_systemd_analyze(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    folder = tmp_path_factory.mktemp("unit")
    dirty = data.draw(st.integers(0, 2)) == 0
    value = data.draw(unit_values(dirty))
    np = data.draw(st.sampled_from(NUMBERS))
    text = (
        f"[Service]\nEnvironment=LLAMA_ARG_UBATCH={value}\n"
        f"ExecStart=/bin/true -np {np} -m {data.draw(unit_values(dirty))}\n"
    )
    unit = folder / "llm.service"
    unit.write_bytes(text.encode("utf-8", "surrogateescape"))
    read = read_deploy_file(unit)
    if read.not_understood:
        event("refused")
        return
    event("accepted: verified")
    assert all(b in ALLOWED for b in text.encode("utf-8", "surrogateescape"))
    output = _verify(unit)
    words = (str(unit), "Invalid", "not executable")
    complaints = [line for line in output.splitlines() if any(w in line for w in words)]
    assert complaints == [], output


@needs_analyze
@pytest.mark.parametrize("blank", UNICODE_BLANKS)
def test_systemd_keeps_a_unicode_blank_inside_a_word(tmp_path: Path, blank: str) -> None:
    unit = tmp_path / "llm.service"
    unit.write_text(f"[Service]\nExecStart=/bin/true{blank}-np 4\n")
    assert read_deploy_file(unit).not_understood
    assert f"/bin/true{blank}-np" in _verify(unit)  # one word: a program of that name
