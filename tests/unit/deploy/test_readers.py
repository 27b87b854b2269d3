"""The deploy readers are allowlists (issue 40): ``serve`` proves the cell at start, so a reader
only finds the one serve launch, reads a server's argv well enough to name its cell, and refuses
with its line anything off the list (fail closed) instead of modelling it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from batch_invariance.cert.provenance import ModelFileRecord, Provenance
from batch_invariance.deploy.deploy_report import load_deploy_cells
from batch_invariance.deploy.readers.config import deploy_format, read_deploy_file
from batch_invariance.deploy.readers.shell import shell_commands
from batch_invariance.deploy.readers.source_bytes import ALLOWED
from batch_invariance.deploy.readers.systemd import unit_commands
from batch_invariance.errors import UsageError
from batch_invariance.gate.cells import cell_of
from batch_invariance.gate.identity import ModelIdentity, identify_model, model_differences
from batch_invariance.gate.server_command import DeployRead, ServerCommand

MODEL = "gemma-3-270m-q4_k_m"
SERVE = "exec batch-invariance serve --certs /c -- llama-server -m /m/a.gguf -c 4096 -np 4"


def _read(text: str, name: str = "run.sh") -> DeployRead:
    return shell_commands(text, name)


def _cells(text: str) -> list[tuple[str, int | None, int, str]]:
    read = _read(text)
    assert read.not_understood == (), read.unmodelled
    return [(c.name, c.ctx, c.parallel, c.layout_name) for c in (cell_of(x) for x in read.commands)]


def _refused(text: str, name: str = "run.sh") -> str:
    found = _read(text, name).unmodelled
    assert found, f"passed: {text!r}"
    return found[0]


def test_an_ordinary_serve_script_is_read() -> None:
    text = (
        "#!/usr/bin/env bash\n# the LLM\nset -euo pipefail\nulimit -n 65536\numask 027\n"
        "export OMP_NUM_THREADS=4 CUDA_VISIBLE_DEVICES=0\nmodel=unused\ncd /srv\n"
        "echo starting >>/var/log/llm.log\nexec >>/var/log/llm.log 2>&1\n"
        "exec batch-invariance serve --certs /c --cert-identity-regexp '^https://x/.*$' -- \\\n"
        "  llama-server -m '/m/a b.gguf' --api-key team#42 -c 4096 -np 4 2>&1\n"
    )
    (command,) = _read(text).commands
    assert command.origin == "run.sh:11" and command.base_dir == Path("/srv")
    # Quotes keep blanks and a $ in single quotes, and are removed; '#' inside a word is its.
    assert command.argv[5] == "^https://x/.*$"
    assert command.argv[-7:] == ("/m/a b.gguf", "--api-key", "team#42", "-c", "4096", "-np", "4")
    assert dict(command.env) == {"OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "0"}
    # Nothing after exec runs, so nothing after it is read.
    assert _read(f"{SERVE}\nllama-server -m /m/b.gguf &\n").not_understood == ()


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("llama-server -m /m/a.gguf -np 8 &", "& (an operator"),
        ("llama-server -m /m/a.gguf -np 8; true", "8; (an operator"),
        ("true && llama-server -m /m/a.gguf", "&& (an operator"),
        ("[ -f x ] || exit 1", "[ (an operator"),
        ("nohup llama-server -m /m/a.gguf", "runs nohup"),
        ("env -i llama-server -m /m/a.gguf", "runs env"),
        ("sudo -u llm batch-invariance serve --certs /c -- llama-server", "runs sudo"),
        ("python -m batch_invariance serve", "runs python"),
        ("curl -o /m/a.gguf https://x", "runs curl"),
        ("source /etc/llm.env", "runs source"),
        (". /etc/llm.env", "runs ."),
        ("llama-server -m $(cat /m/name)", "$(cat"),
        ("llama-server -m `cat /m/name`", "`cat"),
        ("llama-server -m *.gguf", "*.gguf (an operator, glob"),
        ("llama-server -m ~/a.gguf", "~/a.gguf"),
        ('llama-server -m "/m/a.gguf', "unterminated quote"),
        ("llama-server -m /m/a.gguf \\;", "(command substitution or backslash)"),
        # The serve line is written out: no variable is expanded, quoted or not.
        ("llama-server -m $MODEL", "$MODEL (a $ expansion; write the value out)"),
        ('llama-server -m "${MODEL}"', '"${MODEL}" (a $ expansion'),
        ("llama-server -m ${MODEL:-/m/a.gguf}", "${MODEL:-/m/a.gguf}"),
        ("llama-server <<EOF", "<<EOF"),
        ("cd models", "cd to anything but one absolute folder"),
        ("set -a", "set -a"),
        ("printf -v PATH /tmp", "printf with an option"),
        ("PYTHONPATH=/tmp/x", "PYTHONPATH assigned without export"),
        ("export 'A B'=1", "export A B=1"),
        ("echo 'import os' > /venv/lib/site-packages/x.pth", "output to /venv/lib/site-packages"),
        ("printf x >>/etc/ld.so.preload", "output to /etc/ld.so.preload"),
        ("echo x >", "> with no target"),
        ("export IFS=/", "IFS= (it changes how the shell"),
        ("BASH_ENV=/tmp/x", "BASH_ENV= (it changes"),
        ("llama-server -m /m/a.gguf -np 1", "a second launch (the first is run.sh:2)"),
    ],
)
def test_a_line_off_the_allowlist_is_refused_with_its_line(line: str, why: str) -> None:
    found = _refused(f"#!/bin/sh\n{line}\n{SERVE}\n")
    where = "run.sh:3:" if "second launch" in why else "run.sh:2:"
    assert found.startswith(f"{where} not understood: ") and why in found, found


def test_a_foreign_shell_and_continued_comments_are_refused() -> None:
    assert "the #! line '#!/usr/bin/python3'" in _refused(f"#!/usr/bin/python3\n{SERVE}\n")
    assert "the #! line '#!/bin/bash -p'" in _refused(f"#!/bin/bash -p\n{SERVE}\n")
    # A comment's backslash continues nothing: the next line is a launch of its own.
    assert "a second launch" in _refused(f"# old \\\nllama-server -m /m/a.gguf\n{SERVE}\n")


def test_bytes_the_shells_split_otherwise_are_refused_where_they_are() -> None:
    assert frozenset({0x09, 0x0A, *range(0x20, 0x7F)}) == ALLOWED
    for byte in ("\u00a0", "\r", "\x00", "\x0b", "\u3000"):
        found = _refused(f"#!/bin/sh\nllama-server -m /m/a.gguf{byte}-np 8\n")
        assert found.startswith("run.sh:2: not understood: ") and "byte offset 35" in found


def _unit(tmp_path: Path, text: str, drop_in: str = "") -> DeployRead:
    unit = tmp_path / "llm.service"
    unit.write_text(text)
    if drop_in:
        (tmp_path / "llm.service.d").mkdir(exist_ok=True)
        (tmp_path / "llm.service.d" / "10-x.conf").write_text(drop_in)
    return unit_commands(unit, text)


def test_a_unit_with_limits_and_logging_keys_is_read(tmp_path: Path) -> None:
    read = _unit(tmp_path, (
        "[Unit]\nDescription=llm\nAfter=network.target\n[Service]\nType=exec\nUser=llm\n"
        "Nice=5\nLimitNOFILE=65536\nMemoryMax=8G\nRestart=on-failure\nStandardOutput=journal\n"
        'Environment="A=1 2" B=x\nEnvironment=OMP_NUM_THREADS=4\n'
        "WorkingDirectory=/srv\nExecStart=-/usr/bin/llama-server -m \"/m/a b.gguf\" \\\n  -np 4\n"
        "[Install]\nWantedBy=multi-user.target\n"
    ))  # fmt: skip
    assert read.not_understood == (), read.unmodelled
    (command,) = read.commands
    assert command.argv == ("/usr/bin/llama-server", "-m", "/m/a b.gguf", "-np", "4")
    assert dict(command.env) == {"A": "1 2", "B": "x", "OMP_NUM_THREADS": "4"}
    assert command.base_dir == Path("/srv") and command.origin == "llm.service:15"


def test_a_drop_in_that_adds_an_execstart_without_resetting_it_is_refused(tmp_path: Path) -> None:
    # One that resets and replaces it is read: test_closed.py's unit with a drop-in.
    read = _unit(tmp_path, "[Service]\nExecStart=/usr/bin/llama-server -np 8\n",
                 "[Service]\nExecStart=/usr/bin/llama-server -np 4\n")  # fmt: skip
    assert "2 ExecStart= command lines" in read.unmodelled[0]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("ExecStartPre=/usr/bin/curl -o /m/a.gguf x", "ExecStartPre= in [Service] (not on the"),
        ("ExecStartPost=/usr/bin/llama-server -np 8", "ExecStartPost= in [Service]"),
        ("EnvironmentFile=/etc/llm.env", "EnvironmentFile= in [Service]"),
        ("PassEnvironment=PYTHONPATH", "PassEnvironment= in [Service]"),
        ("UnsetEnvironment=A", "UnsetEnvironment= in [Service]"),
        ("Type=forking", "Type=forking"),
        ("Nice=$N", "Nice=$N (only plain values)"),
        ("WorkingDirectory=~", "WorkingDirectory=~"),
        ("Description=%n", "a % specifier"),
        ("Environment=A='x'", "Environment= word"),
        ('Environment=A="x y"', "a quote that does not enclose a whole word"),
        ("ExecStart=", "0 ExecStart= command lines"),
        ("[Socket]", "section [Socket]"),
        ("ExecStart=\nExecStart=@/usr/bin/llama-server llm -np 4", "ExecStart= prefix @"),
        ("ExecStart=\nExecStart=llama-server -np 4", "not an absolute path"),
        ("ExecStart=\nExecStart=/usr/bin/llama-server -m ${M}", "${M} (a $ expansion)"),
        ('ExecStart=\nExecStart=/usr/bin/llama-server -m "$M"', '"$M" (a $ expansion)'),
        ("ExecStart=\nExecStart=/usr/bin/llama-server -m a\\b", "ExecStart= word a\\b"),
        ("ExecStart=\nExecStart=/usr/bin/llama-server \\\n# x\n -np 4", "a comment inside a \\"),
    ],
)
def test_a_unit_line_off_the_allowlist_is_refused(tmp_path: Path, line: str, why: str) -> None:
    text = f"[Service]\nExecStart=/usr/bin/llama-server -np 4\n{line}\n"
    found = _unit(tmp_path, text).unmodelled
    assert found and why in found[0], found


def test_a_template_unit_and_a_shell_execstart(tmp_path: Path) -> None:
    template = tmp_path / "llm@.service"
    text = "[Service]\nExecStart=/usr/bin/llama-server -np 4\n"
    assert "a template unit" in unit_commands(template, text).unmodelled[0]
    # Read, and then the gate names no server: sh is not one (test_check_deploy).
    read = _unit(tmp_path, "[Service]\nExecStart=/bin/sh -c 'llama-server -np 8'\n")
    assert read.commands[0].argv[0] == "/bin/sh"


@pytest.mark.parametrize(
    ("line", "cell"),
    [
        # No -np: 4 slots sharing one unified pool; each slot's share is -c / 4.
        (f"-m /m/{MODEL}.gguf -c 8192", (MODEL, 2048, 4, "unified")),
        # -np -1 is auto too, and auto forces unified even over -no-kvu (server.cpp).
        ("-m a.gguf -c 8192 -np -1 -no-kvu", ("a", 2048, 4, "unified")),
        ("-m a.gguf -c 8192 -np 4", ("a", 2048, 4, "split")),
        ("-m a.gguf --ctx_size 8192 --parallel 4 -kvu", ("a", 2048, 4, "unified")),
        # The last -c counts, padded as llama.cpp pads it (a slot never gets under 256; -c 4097
        # is test_closed.py's).
        ("-m a.gguf -c 1 -c 64 -np 2", ("a", 256, 2, "split")),
        ("-m /nowhere/a.gguf -np 2", ("a", None, 2, "split")),  # ctx 0: the model's, unknown
    ],
)
def test_llama_server_slot_rules(line: str, cell: tuple[str, int | None, int, str]) -> None:
    assert _cells(f"llama-server {line}\n") == [cell]


def test_bad_values_and_empty_files_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"deploy.sh:1: -np needs an integer"):
        cell_of(ServerCommand("deploy.sh:1", ("llama-server", "-m", "a.gguf", "-np", "four"), {}))
    with pytest.raises(UsageError, match="no model"):
        cell_of(ServerCommand("deploy.sh:1", ("llama-server", "-c", "4096"), {}))
    config = tmp_path / "deploy.sh"
    config.write_text("echo nothing here\n")
    with pytest.raises(UsageError, match="no llama-server command line"):
        load_deploy_cells(config)


def test_model_identity_uses_the_strongest_check_available(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF-one")
    sha = hashlib.sha256(b"GGUF-one").hexdigest()
    recorded = Provenance(model_file=ModelFileRecord(name="m.gguf", size=8, sha256=sha))
    found = identify_model(model, str(model))
    assert found.method == "sha256" and model_differences(found, recorded) == ()
    no_sha = Provenance(model_file=ModelFileRecord(name="m.gguf", size=8))
    assert model_differences(found, no_sha) == ("the cert records no model sha256",)
    by_stat = ModelIdentity("size and name", "m.gguf", size=8)
    assert model_differences(by_stat, recorded) == ()
    assert model_differences(ModelIdentity("size and name", "m.gguf", size=9), recorded)
    absent = model_differences(identify_model(tmp_path / "x.gguf", "x"), recorded)
    assert "cannot be checked" in absent[0]
    hub = identify_model(None, "org/repo:Q4_K_M")
    assert hub.method == "nothing" and model_differences(hub, recorded)


def test_the_format_is_decided_by_the_name_as_the_runner_decides(tmp_path: Path) -> None:
    assert [deploy_format(Path(n)) for n in ("a.service", "c.yml", "m.toml", "run", "x.sh")] == [
        "unit", "compose", "toml", "shell", "shell"
    ]  # fmt: skip
    # A unit's header in a script is a shell word; a script's #! in a unit is a comment.
    script = tmp_path / "run.sh"
    script.write_text("[Service]\nExecStart=/usr/bin/llama-server -m /a.gguf\n")
    assert read_deploy_file(script).not_understood[0].line == 1
    timer = tmp_path / "llm.timer"
    timer.write_text("[Timer]\nOnBootSec=1\n")
    assert "a .timer file" in read_deploy_file(timer).unmodelled[0]
