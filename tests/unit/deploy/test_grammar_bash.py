"""The shell grammar against real bash (hypothesis properties).

1. Deploys built from the grammar run under real ``bash`` with a recording stub server (a
   script that writes its argv, environment, executable and working folder): what it
   records equals what check-deploy's reader says the file starts.
2. The same deploys, mutated with a construct outside the grammar at a reachable line, are
   refused, and the refusal names that line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batch_invariance.deploy.readers.config import shell_commands

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash is not installed")

#: Variables bash puts in every child's environment itself (not the file's).
BASH_ADDS = frozenset({"PWD", "SHLVL", "_", "OLDPWD"})
STUB = """#!/usr/bin/python3 -S
import json, os, sys
raw = open("/proc/self/environ", "rb").read().split(b"\\0")
env = dict(e.decode().split("=", 1) for e in raw if e)
json.dump({"argv": sys.argv[1:], "exe": os.path.realpath(sys.argv[0]), "cwd": os.getcwd(),
           "env": env}, open(os.environ.get("REC_FILE") or "/dev/null", "w"))
"""


@dataclass(frozen=True)
class World:
    root: Path
    bin: Path
    other: Path
    folders: tuple[Path, ...]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("bash")
    for name in ("bin", "other"):
        folder = root / name
        folder.mkdir()
        stub = folder / "llama-server"
        stub.write_text(STUB)
        stub.chmod(0o755)
    folders = tuple(root / f"d{i}" for i in range(3))
    for folder in folders:
        folder.mkdir()
    return World(root, root / "bin", root / "other", folders)


NAMES = ("NP", "CTX", "MODEL", "EXTRA", "LLAMA_ARG_UBATCH", "GGML_X", "LC_ALL")
SAFE = st.text(alphabet="abcxyz0189-_./:=,@%+", min_size=1, max_size=8)


def _quoted(value: str) -> st.SearchStrategy[str]:
    """Ways to write ``value`` as one shell word the grammar allows."""
    ways = [st.just(f"'{value}'"), st.just(f'"{value}"')]
    if value and value[0] not in "#" and all(c not in "'\" " for c in value):
        ways.append(st.just(value))
    if " " in value:
        ways.append(st.just(value.replace(" ", "\\ ")))
    return st.one_of(ways)


@st.composite
def deploys(draw: st.DrawFn, world: World) -> tuple[list[str], int]:
    """Lines of a deploy in the grammar, and the index of its launch line."""
    lines = ["#!/bin/bash"]
    errexit = draw(st.booleans())
    if errexit:
        lines.append(draw(st.sampled_from(["set -e", "set -eu", "set -euo pipefail"])))
    lines.append(f"export PATH={world.bin}:/usr/bin:/bin")
    if draw(st.booleans()):
        lines.append("set -a")
    values: dict[str, str] = {}
    for _ in range(draw(st.integers(0, 5))):
        assigned = draw(st.sampled_from(NAMES))
        value = draw(st.one_of(SAFE, st.builds(lambda a, b: f"{a} {b}", SAFE, SAFE)))
        word = draw(_quoted(value))
        reads = assigned.startswith(("LLAMA_ARG_", "GGML_"))
        lines.append(f"export {assigned}={word}" if reads or draw(st.booleans()) else
                     f"{assigned}={word}")  # fmt: skip
        values[assigned] = value
    kind = draw(st.sampled_from(["none", "guarded", "errexit"]))
    folder = draw(st.sampled_from(world.folders))
    if kind == "guarded":
        lines.append(f"cd {folder} || exit 1")
    elif kind == "errexit" and errexit:
        lines.append(f"cd {folder}")
    if draw(st.booleans()):
        lines.append(f'echo "starting" >> {world.root}/deploy.log')
    if draw(st.booleans()):
        lines.append(f"test -x {world.bin}/llama-server || exit 1")
    words: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        choice = draw(st.sampled_from(["literal", "quoted", "var", "qvar", "braced"]))
        name = draw(st.sampled_from(sorted(values))) if values else None
        if choice == "var" and name:
            words.append(f"${name}")
        elif choice == "qvar" and name:
            words.append(f'"${name}"')
        elif choice == "braced" and name:
            words.append(f"x${{{name}}}y")
        else:
            words.append(draw(_quoted(draw(st.one_of(SAFE, st.just("a b"))))))
    launch = []
    for _ in range(draw(st.integers(0, 2))):
        launch.append(f"{draw(st.sampled_from(NAMES[:4]))}={draw(SAFE)}")
    if draw(st.booleans()):
        launch.append("exec")
    wrapper = draw(st.sampled_from(["", "/usr/bin/env", "/usr/bin/env -i", "/usr/bin/nohup"]))
    if wrapper.startswith("/usr/bin/env"):
        launch.append(wrapper)
        launch.append(f"PATH={world.other}:/usr/bin")
        launch.append(f"REC_FILE={world.root}/rec.json")
    elif wrapper:
        launch.append(wrapper)
    program = draw(st.sampled_from(["llama-server", f"{world.other}/llama-server"]))
    launch += [program, *words]
    if draw(st.booleans()):
        launch.append(f"> {world.root}/server.log 2>&1")
    lines.append(" ".join(launch))
    index = len(lines) - 1
    if draw(st.booleans()):
        lines.append("echo after the server")
    return lines, index


def _run(world: World, text: str) -> dict[str, object]:
    script = world.root / "deploy.sh"
    script.write_text(text)
    record = world.root / "rec.json"
    record.unlink(missing_ok=True)
    assert BASH is not None
    env = {"REC_FILE": str(record)}
    done = subprocess.run([BASH, str(script)], env=env, cwd=world.root, capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    data: dict[str, object] = json.loads(record.read_text())
    return data


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_what_the_reader_reads_is_what_bash_starts(world: World, data: st.DataObject) -> None:
    lines, index = data.draw(deploys(world))
    text = "\n".join(lines) + "\n"
    read = shell_commands(text, "deploy.sh")
    assert read.not_understood == (), read.unmodelled
    (command,) = read.commands
    assert command.origin == f"deploy.sh:{index + 1}"
    seen = _run(world, text)
    assert seen["argv"] == list(command.argv[1:])
    program = command.argv[0]
    if "/" not in program:
        assert command.search_path is not None
        found = shutil.which(program, path=command.search_path)
        assert found is not None
        program = found
    assert seen["exe"] == os.path.realpath(program)
    recorded = {k: v for k, v in dict(seen["env"]).items() if k not in BASH_ADDS}  # type: ignore[call-overload]
    recorded.pop("REC_FILE", None)
    expected = {k: v for k, v in command.env.items() if k != "REC_FILE"}
    assert recorded == expected
    if command.base_dir is not None:
        assert seen["cwd"] == str(command.base_dir)
    else:
        assert seen["cwd"] == str(world.root)  # the caller's folder: the file does not fix it


#: Statements outside the grammar (each refused wherever it is reachable).
MUTATIONS = (
    "declare -x LLAMA_ARG_UBATCH=512", "printf -v NP 8", "read -r NP", "(( NP = 8 ))",
    "IFS=,", "echo {a,b}", "set -o posix", "trap 'echo x' EXIT", "eval echo x",
    "alias ls=true", "f() { true; }", "[ -f /x ] && exit 0", "pushd /tmp",
    "PATH=./bin:/usr/bin", "curl -o /tmp/a.gguf http://x", "cp a b", "echo x > /tmp/cfg.ini",
    "for i in 1; do true; done", "if true; then true; fi", "echo $(id)", "echo `id`",
    "echo ~", "echo *", "echo ${X:-y}", "echo $1", "echo $'x'", "cat <<EOF", "sudo true",
    "bash -c true", "export -n X", "source x.sh", "exec 3< /etc/passwd", "true | true",
    "shopt -s expand_aliases", "BASH_ENV=/x", "CDPATH=/",
    "unset -f cd", "true &", "exit 1 2", "set -o allexport -o vi", "enable -n echo",
    "command -v llama-server", "builtin echo x", "ulimit -n 10", "umask 077",
)  # fmt: skip


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_every_construct_outside_the_grammar_is_refused_with_its_line(
    world: World, data: st.DataObject
) -> None:
    lines, index = data.draw(deploys(world))
    at = data.draw(st.integers(1, index))  # reachable: before the launch line
    mutation = data.draw(st.sampled_from(MUTATIONS))
    mutated = [*lines[:at], mutation, *lines[at:]]
    found = shell_commands("\n".join(mutated) + "\n", "deploy.sh").not_understood
    assert found, f"passed: {mutation!r}"
    assert (found[0].file, found[0].line) == ("deploy.sh", at + 1), (mutation, found[0])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_words_outside_the_grammar_on_the_launch_line_are_refused(
    world: World, data: st.DataObject
) -> None:
    lines, index = data.draw(deploys(world))
    word = data.draw(
        st.sampled_from(
            [
                "*.gguf",
                "~/m",
                "{a,b}",
                "$(id)",
                "`id`",
                "${X:-1}",
                "$1",
                "$'x'",
                "a[0]",
                "!x",
                "$UNSET_ONE",
                "a|b",
            ]
        )
    )
    lines[index] = f"{lines[index]} {word}" if ">" not in lines[index] else lines[index].replace(
        " >", f" {word} >", 1)  # fmt: skip
    cr = data.draw(st.booleans())
    if cr:
        lines[index] += "\r"
    found = shell_commands("\n".join(lines) + "\n", "deploy.sh").not_understood
    assert found and found[0].line == index + 1, (word, found)
