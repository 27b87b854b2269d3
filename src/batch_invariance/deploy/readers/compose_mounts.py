"""Where a compose server service's bind mounts may not land: on or above the server binary
of its image or a library it loads (beside the binary, in the working folder, or a folder the
dynamic loader reads), or a config file llama-server would read in the container.

Paths are compared through a :class:`PathIndex` (a trie of their components), in time
proportional to the path asked about: comparing every pair (thousands of mounts against
thousands of folders) was work the compose file's size does not show.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from posixpath import normpath
from typing import Any

from batch_invariance.deploy.readers.commands import BindMount
from batch_invariance.deploy.readers.compose_yaml import Refused
from batch_invariance.engines.llama_server.env import SYSTEM_CONFIG

#: The ``PATH`` a bare entrypoint is looked up on when the service sets none (Docker's default).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What the dynamic loader reads the server's libraries and its own configuration from.
LOADER_PATHS = (
    "/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/local/lib",
    "/usr/local/cuda", "/etc/ld.so.preload", "/etc/ld.so.cache", "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
)  # fmt: skip
_FIRST = 0  # key of a node: the first path (by index) on or below it
_END = 1  # key of a node: the first path (by index) that ends there


class PathIndex:
    """Paths (in order) as a trie of their components (split at ``/`` as written): ``A`` is on
    or above ``B`` when ``B + "/"`` starts with ``A + "/"``, that is when ``A``'s components
    begin ``B``'s."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.root: dict[Any, Any] = {}
        for index, path in enumerate(paths):
            node = self.root
            for part in path.split("/"):
                node = node.setdefault(part, {})
                node.setdefault(_FIRST, index)
            node.setdefault(_END, index)

    def above(self, path: str) -> int | None:
        """The index of the first path on or above ``path``, or ``None``."""
        found: list[int] = []
        node: dict[Any, Any] | None = self.root
        for part in path.split("/"):
            node = node.get(part) if node is not None else None
            if node is None:
                break
            if _END in node:
                found.append(node[_END])
        return min(found, default=None)

    def below(self, path: str) -> int | None:
        """The index of the first path on or below ``path``, or ``None``."""
        node: dict[Any, Any] | None = self.root
        for part in path.split("/"):
            node = node.get(part) if node is not None else None
            if node is None:
                return None
        return None if node is None else int(node[_FIRST])


def _covers(mount: str, path: str) -> bool:
    """A bind mount at container path ``mount`` lands on ``path`` or on a folder above it."""
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def config_mounts(mounts: list[BindMount], env: dict[str, str], line: int) -> None:
    """A bind mount on or above a config file llama-server would read in the container, or
    at a config folder."""
    home = env.get("HOME", "/root")  # the published images run as root
    user = f"{env.get('XDG_CONFIG_HOME', home + '/.config')}/llama.cpp/config.ini"
    for mount in mounts:
        for path in (SYSTEM_CONFIG, user):
            if not _covers(mount.container, path):
                continue
            host = Path(mount.host + path[len(mount.container.rstrip("/")) :])
            shows = f"shows {host} as" if host.exists() else "lands on or above"
            raise Refused(line, f"a bind mount at {mount.container} {shows} {path}, which the "
                           "server reads", "mount only model files")  # fmt: skip
        if ".config" in mount.container or "llama.cpp" in mount.container:
            raise Refused(line, f"a bind mount at {mount.container} (a config folder)",
                           "mount only the model folder")  # fmt: skip


def binaries(program: str, env: dict[str, str], workdir: str) -> list[str]:
    """Where the container's server binary may be: the entrypoint's path, or for a bare name
    each folder of the service's ``PATH`` (else Docker's default)."""
    if program.startswith("/"):
        return [normpath(program)]
    if "/" in program:
        return [normpath(f"{workdir}/{program}")]
    folders = env.get("PATH") or DEFAULT_PATH
    return [normpath(f"{f}/{program}") for f in folders.split(":") if f.startswith("/")]


_IMAGE_FIX = "mount only model folders: the server binary and its libraries come from the image"


def binary_mounts(mounts: list[BindMount], binaries: list[str], workdir: str, line: int) -> None:
    """A bind mount that would replace the server the container runs: on or above its binary,
    or at a library beside it (or in the working folder, where ggml looks for its backends)."""
    fix = _IMAGE_FIX
    index = PathIndex(binaries)  # each mount looked up, not compared with every binary
    beside = {b.rsplit("/", 1)[0] or "/" for b in binaries} | {workdir.rstrip("/") or "/"}
    for mount in mounts:
        target = mount.container
        # on or above: the binary is the target, or under target.rstrip("/") (``_covers``)
        first = index.below(target.rstrip("/"))
        if first is not None:
            raise Refused(line, f"a bind mount at {target} lands on or above the server "
                           f"binary {binaries[first]} of the image", fix)  # fmt: skip
        folder, name = target.rsplit("/", 1)
        if (folder or "/") in beside and (name.startswith("lib") or ".so" in name):
            raise Refused(line, f"a bind mount at {target}, a library the server loads from "
                           "its folder", fix)  # fmt: skip


def loader_mounts(mounts: list[BindMount], line: int) -> None:
    """A bind mount on, above or inside a folder the dynamic loader reads libraries from."""
    fix = _IMAGE_FIX
    for mount in mounts:
        target = mount.container
        for path in LOADER_PATHS:
            if _covers(target, path) or _covers(path, target):
                raise Refused(line, f"a bind mount at {target} over {path}, which the dynamic "
                               "loader reads the server's libraries from", fix)  # fmt: skip
