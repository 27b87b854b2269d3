"""The files ``serve`` runs, pinned: opened once, hashed through the descriptor, and refused
when someone other than the user running serve (or root) could change them."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from batch_invariance.errors import NotCovered
from batch_invariance.serve.pinned_files import FileLayoutRefused, PinnedFile, pin, sha256_fd


@pytest.fixture()
def pinned() -> Iterator[list[PinnedFile]]:
    """Every file a test pins, closed afterwards."""
    opened: list[PinnedFile] = []
    yield opened
    for done in opened:
        os.close(done.fd)


def _file(folder: Path, name: str, data: bytes, mode: int = 0o644) -> Path:
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    path.chmod(mode)
    return path


def test_the_hash_is_read_through_the_descriptor_and_a_later_swap_changes_nothing(
    tmp_path: Path, pinned: list[PinnedFile]
) -> None:
    data = os.urandom(3 << 20) + b"tail"  # more than one read block
    model = _file(tmp_path / "m", "a.gguf", data)
    got = pin("model", str(model), folders=False)
    pinned.append(got)
    assert got.sha256 == hashlib.sha256(data).hexdigest() == sha256_fd(got.fd)
    assert not os.get_inheritable(got.fd)  # close-on-exec until serve hands it on
    assert os.lseek(got.fd, 0, os.SEEK_CUR) == 0  # pread: the offset never moved
    other = _file(tmp_path / "m", "b.gguf", b"GGUF another model")
    os.replace(other, model)
    assert Path(got.fd_path).read_bytes() == data  # what the server opens: the pinned inode
    assert sha256_fd(got.fd) == got.sha256


def test_a_symlink_is_resolved_once_and_a_flip_of_it_does_not_matter(
    tmp_path: Path, pinned: list[PinnedFile]
) -> None:
    first = _file(tmp_path / "v1", "a.gguf", b"GGUF measured")
    second = _file(tmp_path / "v2", "a.gguf", b"GGUF unmeasured")
    link = tmp_path / "current.gguf"
    link.symlink_to(first)
    got = pin("model", str(link), folders=False)
    pinned.append(got)
    assert (got.path, got.resolved) == (str(link), os.path.realpath(first))
    flipped = tmp_path / ".flip"
    flipped.symlink_to(second)
    os.replace(flipped, link)
    assert Path(got.fd_path).read_bytes() == b"GGUF measured"


def test_files_and_binary_folders_others_can_write_are_refused(
    tmp_path: Path, pinned: list[PinnedFile]
) -> None:
    binary = _file(tmp_path / "opt" / "bin", "llama-server", b"\x7fELF", 0o755)
    folder = binary.parent.resolve()
    for mode, words in ((0o775, "group-writable"), (0o777, "group-world-writable")):
        folder.chmod(mode)
        with pytest.raises(
            FileLayoutRefused, match=re.escape(f"folder {folder} is {words} without")
        ):
            pin("server binary", str(binary), folders=True)
    # Sticky (as /tmp): only an entry's owner (you or root, checked) can rename or remove it.
    folder.chmod(0o1777)
    pinned.append(pin("server binary", str(binary), folders=True))
    folder.chmod(0o755)
    binary.chmod(0o775)
    with pytest.raises(FileLayoutRefused, match=r"is group-writable \(mode 0775\)"):
        pin("server binary", str(binary), folders=True)
    # The model's folders are not checked: the server never opens the model by its path.
    model = _file(tmp_path / "shared", "a.gguf", b"GGUF")
    model.parent.chmod(0o777)
    pinned.append(pin("model", str(model), folders=False))
    model.chmod(0o646)
    with pytest.raises(FileLayoutRefused, match=r"world-writable.*chmod go-w"):
        pin("model", str(model), folders=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_file_or_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    binary = _file(tmp_path / "opt" / "bin", "llama-server", b"\x7fELF", 0o755)
    os.chown(binary, 4321, -1)
    with pytest.raises(FileLayoutRefused, match="belongs to uid 4321, neither you nor root"):
        pin("server binary", str(binary), folders=True)
    os.chown(binary, 0, -1)
    os.chown(binary.parent.parent, 4321, -1)
    with pytest.raises(
        FileLayoutRefused, match=re.escape(f"folder {binary.parent.parent.resolve()} ")
    ):
        pin("server binary", str(binary), folders=True)


def test_what_is_not_a_readable_regular_file_is_not_covered(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(NotCovered, match="is not a regular file"):
        pin("model", str(fifo), folders=False)  # refused at once, not hung on the FIFO
    with pytest.raises(NotCovered, match="cannot be read"):
        pin("model", str(tmp_path / "absent.gguf"), folders=False)
