"""One dialect per script, decided as the kernel decides it (its ``#!`` line), and control flow
as the shells run it: an sh script (or one with no ``#!``) is read with the grammar on which
dash and bash agree, and ``exec PROGRAM &`` does not end the script."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from batch_invariance.deploy.readers.config import shell_commands
from batch_invariance.deploy.readers.shell_dialect import script_dialect

DASH = shutil.which("dash")
BASH = shutil.which("bash")


@pytest.mark.parametrize(
    ("first", "dialect"),
    [
        ("#!/bin/bash", "bash"), ("#!/usr/bin/bash", "bash"), ("#!/usr/bin/env bash", "bash"),
        ("#! /bin/bash ", "bash"), ("#!/bin/sh", "sh"), ("#!/usr/bin/sh", "sh"),
        ("#!/bin/dash", "sh"), ("#!/usr/bin/env sh", "sh"), ("#!/usr/bin/env\tdash", "sh"),
        ("# no shebang", "sh"), ("llama-server -m a.gguf", "sh"), (" #!/bin/bash", "sh"),
        ("#!/bin/bash -a", None), ("#!/bin/bash -e", None), ("#!/bin/zsh", None),
        ("#!/usr/bin/env -S bash -e", None), ("#!/usr/bin/python3", None), ("#!bash", None),
        ("#!/bin/busybox sh", None), ("#!/usr/bin/env", None),
    ],
)  # fmt: skip
def test_the_shebang_picks_the_dialect_as_the_kernel_reads_it(
    first: str, dialect: str | None
) -> None:
    assert script_dialect(first + "\nexit 0\n").dialect == dialect


BODY = "llama-server -m /m/a.gguf -c 4096 -np 4"
#: Constructs bash reads one way and dash another (or not at all).
BASH_ONLY = [
    (f"{BODY} &> /var/log/llm.log", "&> in an sh script"),
    (f"{BODY} &>> /var/log/llm.log", "&>> in an sh script"),
    (f"source /etc/llm/env.sh\n{BODY}", "source in an sh script"),
    (f"set -euo pipefail\n{BODY}", "set -o pipefail in an sh script"),
]


@pytest.mark.parametrize(("body", "why"), BASH_ONLY, ids=[w for _, w in BASH_ONLY])
@pytest.mark.parametrize("first", ["#!/bin/sh\n", "#!/usr/bin/env dash\n", ""])
def test_sh_scripts_refuse_what_dash_reads_otherwise(first: str, body: str, why: str) -> None:
    found = shell_commands(first + body + "\n", "run.sh").unmodelled
    line = 1 + bool(first)
    assert found and found[0].startswith(f"run.sh:{line}: not understood: {why}"), found


def test_bash_scripts_keep_the_bash_constructs(tmp_path: Path) -> None:
    env = tmp_path / "env.sh"
    env.write_text("export LLAMA_ARG_UBATCH=1\n")
    text = f"#!/bin/bash\nset -euo pipefail\nsource {env}\n{BODY} &> /var/log/llm.log\n"
    read = shell_commands(text, "run.sh")
    assert read.not_understood == () and read.commands[0].env["LLAMA_ARG_UBATCH"] == "1"


def test_a_sourced_file_is_read_in_the_dialect_of_the_script(tmp_path: Path) -> None:
    env = tmp_path / "env.sh"
    env.write_text("#!/bin/bash\nset -o pipefail\n")  # its #! is a comment when sourced
    found = shell_commands(f"#!/bin/sh\n. {env}\n{BODY}\n", "run.sh").not_understood
    assert (found[0].file, found[0].line) == (str(env), 2) and "pipefail" in found[0].construct
    assert shell_commands(f"#!/bin/bash\n. {env}\n{BODY}\n", "run.sh").not_understood == ()


def test_another_interpreter_is_not_understood() -> None:
    (found,) = shell_commands(f"#!/bin/bash -a\nX=1\n{BODY}\n", "run.sh").not_understood
    assert found.line == 1 and "the #! line '#!/bin/bash -a'" in found.construct


def test_a_backgrounded_exec_does_not_end_the_script() -> None:
    text = (
        "#!/bin/sh\nexec llama-server -m /m/a.gguf -c 4096 -np 4 &\n"
        "exec llama-server -m /m/b.gguf -c 8192 -np 8 > /var/log/b.log 2>&1 &\n"
        "llama-server -m /m/c.gguf -c 1024 -np 2\nexec llama-server -m /m/d.gguf\n"
        "llama-server -m /m/never.gguf\n"
    )
    read = shell_commands(text, "run.sh")
    assert read.not_understood == ()
    assert [c.origin for c in read.commands] == ["run.sh:2", "run.sh:3", "run.sh:4", "run.sh:5"]


def _run(shell: str, text: str, folder: Path) -> subprocess.CompletedProcess[str]:
    script = folder / "t.sh"
    script.write_text(text)
    return subprocess.run([shell, str(script)], cwd=folder, capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip


@pytest.mark.skipif(DASH is None or BASH is None, reason="dash or bash is not installed")
def test_the_reasons_hold_under_the_real_shells(tmp_path: Path) -> None:
    """What the refusals say: dash runs ``cmd &> f`` as ``cmd &`` then ``> f`` (the command's
    output is not in f), has no ``source`` and exits on ``set -o pipefail``; bash does not;
    both run a backgrounded ``exec`` in a subshell and go on."""
    assert DASH is not None and BASH is not None
    text = "echo out &> f.log\nwait\n"
    assert _run(BASH, text, tmp_path).stdout == "" and (tmp_path / "f.log").read_text() == "out\n"
    assert _run(DASH, text, tmp_path).stdout == "out\n"
    assert (tmp_path / "f.log").read_text() == ""
    (tmp_path / "e.sh").write_text("echo sourced\n")
    text = f"source {tmp_path}/e.sh\necho after\n"
    assert _run(BASH, text, tmp_path).stdout == "sourced\nafter\n"
    assert _run(DASH, text, tmp_path).stdout == "after\n"  # "source: not found", and on
    text = "set -o pipefail\necho after\n"
    assert _run(BASH, text, tmp_path).stdout == "after\n"
    assert _run(DASH, text, tmp_path).stdout == ""
    text = "exec echo one &\nwait\necho two\n"
    for shell in (BASH, DASH):
        assert _run(shell, text, tmp_path).stdout == "one\ntwo\n"
