"""The container's preflight (ldd on the mounted server) and its file-ownership hand-back."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from batch_invariance.action.ownership import hand_back
from batch_invariance.action.preflight import LinkGaps, check_binary, gap_message, parse_ldd
from batch_invariance.errors import UsageError

LDD_NEWER_GLIBC_AND_CUDA13 = """\
./llama-server: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.38' not found (required by ./llama-server)
./llama-server: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found (required by ./llama-server)
\tlinux-vdso.so.1 (0x00007ffd)
\tlibcudart.so.13 => not found
\tlibggml.so => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)
"""  # noqa: E501

LDD_OK = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibgomp.so.1 => /lib/x86_64-linux-gnu/libgomp.so.1 (0x00007f)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)
"""


def test_parse_ldd_finds_missing_libraries_and_symbol_versions() -> None:
    gaps = parse_ldd(LDD_NEWER_GLIBC_AND_CUDA13)
    assert gaps == LinkGaps(
        libraries=("libcudart.so.13", "libggml.so"), versions=("GLIBC_2.38", "GLIBCXX_3.4.32")
    )
    assert not gaps.ok
    assert parse_ldd(LDD_OK).ok
    assert parse_ldd("\tnot a dynamic executable\n").ok


def test_gap_message_is_one_line_naming_what_is_missing_and_what_to_do() -> None:
    message = gap_message(
        Path("/github/workspace/llama-server"),
        parse_ldd(LDD_NEWER_GLIBC_AND_CUDA13),
        "glibc 2.35",
    )
    assert message == (
        "llama-server /github/workspace/llama-server cannot run in this image (glibc 2.35): "
        "missing libcudart.so.13, libggml.so, GLIBC_2.38, GLIBCXX_3.4.32; link llama.cpp's own "
        "libraries in (cmake -DBUILD_SHARED_LIBS=OFF, as `batch-invariance provision` does) and "
        "build the image on a base that has the rest (a CUDA 13 server needs a CUDA 13 runtime "
        "base) and build llama-server on a host whose glibc/libstdc++ is not newer than the "
        "image's (glibc 2.35) or rebuild the image on a newer base (docker build --build-arg "
        "BASE_IMAGE=..., see docs/action.md)"
    )
    only_glibc = gap_message(Path("s"), LinkGaps((), ("GLIBC_2.38",)), "glibc 2.35")
    assert "missing GLIBC_2.38;" in only_glibc and "BUILD_SHARED_LIBS" not in only_glibc


def test_check_binary_on_a_real_binary_with_a_missing_library(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("ldd") is None:
        pytest.skip("needs a C compiler and ldd")
    (tmp_path / "lib.c").write_text("int bi_gone(void) { return 3; }\n")
    (tmp_path / "main.c").write_text("int bi_gone(void);\nint main(void) { return bi_gone(); }\n")
    lib = tmp_path / "libbi_gone.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "lib.c")], check=True)
    binary = tmp_path / "server"
    subprocess.run(
        [cc, "-o", str(binary), str(tmp_path / "main.c"), f"-L{tmp_path}", "-lbi_gone"], check=True
    )
    lib.unlink()
    with pytest.raises(UsageError) as refused:
        check_binary(binary)
    assert "missing libbi_gone.so;" in str(refused.value)
    assert "\n" not in str(refused.value)
    check_binary(Path(shutil.which("ldd") or "/bin/sh"))  # a script: not dynamic, passes
    check_binary(tmp_path / "absent")  # left to the run, which reports a missing file


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files back needs root (as in the image)")
def test_hand_back_gives_new_root_files_to_the_folders_owner(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    old = workspace / "old-root-file"
    old.write_text("root's, from before the run")
    time.sleep(0.05)
    since = time.time_ns()
    time.sleep(0.05)
    os.chown(workspace, 1001, 1002)
    (workspace / "certs").mkdir()
    (workspace / "certs" / "cell.json").write_text("{}")
    os.symlink("cell.json", workspace / "certs" / "link")
    result = hand_back(workspace, since)
    assert result.error is None and result.changed == 3
    for path in ("certs", "certs/cell.json", "certs/link"):
        info = (workspace / path).lstat()
        assert (info.st_uid, info.st_gid) == (1001, 1002), path
    assert old.stat().st_uid == 0, "files from before the run are not touched"


def test_hand_back_does_nothing_when_the_folder_is_already_ours(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    result = hand_back(tmp_path, 0)
    assert (result.changed, result.error) == (0, None)
    assert (tmp_path / "f").stat().st_uid == os.geteuid()
