"""Bytes first: every deploy reader takes only printable ASCII, tab and newline, and names any
other byte (Unicode blanks, CR, NUL, control bytes, invalid UTF-8) with its line and byte
offset; no reader lets a Python string helper decide a word boundary or a number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import batch_invariance
from batch_invariance.deploy.readers.config import read_deploy_file, shell_commands
from batch_invariance.deploy.readers.source_bytes import ALLOWED, byte_problem, split_blanks

PKG = Path(batch_invariance.__file__).parent

#: Bytes Python's str helpers treat as blanks or line ends, and other bytes outside the set.
BAD = {
    "NBSP U+00A0": "\u00a0".encode(), "EN QUAD U+2000": "\u2000".encode(),
    "IDEOGRAPHIC SPACE U+3000": "\u3000".encode(), "NEL U+0085": "\u0085".encode(),
    "LINE SEPARATOR U+2028": "\u2028".encode(), "FS 0x1c": b"\x1c", "US 0x1f": b"\x1f",
    "VT": b"\x0b", "FF": b"\x0c", "CR": b"\r", "NUL": b"\x00", "DEL": b"\x7f",
    "invalid UTF-8 0xff": b"\xff", "ARABIC-INDIC FOUR": "\u0664".encode(),
}  # fmt: skip


def test_the_byte_set_is_printable_ascii_tab_and_newline() -> None:
    assert {b for b in range(256) if b in ALLOWED} == {9, 10, *range(0x20, 0x7F)}
    assert split_blanks("a\u00a0b \t c\x0bd") == ["a\u00a0b", "c\x0bd"]  # only space and tab


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_shell_script_with_a_byte_outside_the_set_is_not_understood(
    tmp_path: Path, name: str
) -> None:
    bad = BAD[name]
    script = tmp_path / "run.sh"
    head = b"#!/bin/sh\nexport PATH=/opt/bin:/usr/bin\n"
    script.write_bytes(head + b"llama-server -m /m/a.gguf -np" + bad + b"4 -c 4096\n")
    (found,) = read_deploy_file(script).not_understood
    offset = len(head) + len(b"llama-server -m /m/a.gguf -np")
    assert (found.file, found.line) == ("run.sh", 3)
    assert f"at byte offset {offset} (column 30)" in found.construct, found


@pytest.mark.parametrize("name", ["NBSP U+00A0", "CR", "NUL", "VT", "invalid UTF-8 0xff"])
def test_units_drop_ins_and_environment_files_name_the_byte(tmp_path: Path, name: str) -> None:
    bad = BAD[name]
    unit = tmp_path / "llm.service"
    body = b"[Service]\nExecStart=/usr/bin/llama-server -m /m/a.gguf -c 4096 -np 4\n"
    unit.write_bytes(body.replace(b"-np 4", b"-np" + bad + b"4"))
    (found,) = read_deploy_file(unit).not_understood
    offset = body.index(b"-np 4") + 3
    assert (found.file, found.line) == ("llm.service", 2)
    assert f"byte offset {offset} " in found.construct
    # The key itself: systemd would read "Environment\u00a0" as an unknown key.
    unit.write_bytes(b"[Service]\nEnvironment" + bad + b"=LLAMA_ARG_UBATCH=512\n" + body[10:])
    (found,) = read_deploy_file(unit).not_understood
    assert found.line == 2 and "byte offset 21" in found.construct
    unit.write_bytes(body)
    (tmp_path / "llm.service.d").mkdir()
    drop_in = tmp_path / "llm.service.d" / "10-x.conf"
    drop_in.write_bytes(b"[Service]\n\nEnvironment=LLAMA_ARG_UBATCH=" + bad + b"1\n")
    (found,) = read_deploy_file(unit).not_understood
    assert (found.file, found.line) == (str(drop_in), 3), found
    drop_in.write_bytes(b"[Service]\nEnvironmentFile=" + str(tmp_path / "llm.env").encode() + b"\n")
    (tmp_path / "llm.env").write_bytes(b"# env\nLLAMA_ARG_UBATCH=1" + bad + b"\n")
    (found,) = read_deploy_file(unit).not_understood
    assert (found.file, found.line) == (str(tmp_path / "llm.env"), 2), found
    assert "byte offset 24 " in found.construct


def test_a_sourced_file_with_a_byte_outside_the_set_is_not_understood(tmp_path: Path) -> None:
    env = tmp_path / "env.sh"
    env.write_bytes(b"export LLAMA_ARG_UBATCH=\xc2\xa0512\n")
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/sh\n. {env}\nllama-server -m /m/a.gguf\n")
    found = read_deploy_file(script).not_understood
    assert (found[0].file, found[0].line) == (str(env), 1) and "0xc2" in found[0].construct
    assert found[1].line == 2 and "sourced file" in found[1].construct


def test_compose_and_models_files_are_checked_too(tmp_path: Path) -> None:
    for name in ("compose.yaml", "models.toml"):
        path = tmp_path / name
        path.write_bytes(b"services:\n  llm:\n    image:\xe3\x80\x80x\n")
        (found,) = read_deploy_file(path).not_understood
        assert (found.file, found.line) == (name, 3) and "0xe3" in found.construct


@settings(max_examples=200, deadline=None)
@given(
    at=st.integers(0, 200),
    byte=st.sampled_from([b for b in range(256) if b not in ALLOWED]),
)
def test_any_byte_outside_the_set_anywhere_is_named_where_it_is(at: int, byte: int) -> None:
    text = (
        b"#!/bin/bash\nset -eu\nexport PATH=/opt/bin:/usr/bin\n"
        b'export LLAMA_ARG_UBATCH=1 FLAGS="-c 4096 -np 4"\n'
        b"exec llama-server -m /m/a.gguf $FLAGS --host 0.0.0.0\n"
    )
    at = min(at, len(text))
    data = text[:at] + bytes([byte]) + text[at:]
    problem = byte_problem(data, "run.sh")
    assert problem is not None
    assert problem.line == text[:at].count(b"\n") + 1
    assert f"at byte offset {at} " in problem.construct
    found = shell_commands(data.decode("latin-1"), "run.sh").not_understood
    assert found and found[0].line == problem.line


#: The deploy readers and the number reader: where a word boundary or a number is decided.
READERS = sorted(
    [
        *(PKG / "deploy" / "readers").glob("shell*.py"),
        *(PKG / "deploy" / "readers").glob("systemd*.py"),
        PKG / "deploy" / "readers" / "env_file.py",
        PKG / "deploy" / "readers" / "source_bytes.py",
        PKG / "deploy" / "readers" / "config.py",
    ]
)
#: Python helpers that split, strip or read numbers by Python's (Unicode) rules.
HELPERS = re.compile(
    r"\.split\(\)|\.(?:l|r)?strip\(\)|\.isspace\(|\.isdigit\(|\.isdecimal\(|\.isnumeric\("
    r"|\.splitlines\(|read_text\(|\\s|\\S|(?<![\w.])int\(|(?<![\w.])float\("
)


@pytest.mark.parametrize("path", READERS, ids=[p.name for p in READERS])
def test_no_python_string_helper_decides_a_word_or_a_number(path: Path) -> None:
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1)
        if HELPERS.search(line)
    ]
    assert found == []
