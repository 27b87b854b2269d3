"""What a deploy file starts, as the readers report it (value types shared by every reader).

A reader reports each server the file starts (:class:`ServerCommand`) and each construct off
its allowlist (:class:`NotUnderstood`); any one of the latter makes the whole deploy not
covered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

#: How to deploy instead, said with every construct a reader does not understand.
HOW_INSTEAD = (
    "launch with `batch-invariance serve --certs DIR -- llama-server ...` (docs/deploy.md)"
)


class BindMount(NamedTuple):
    """A compose bind mount: the path inside the container and the host path it shows."""

    container: str
    host: str


@dataclass(frozen=True)
class NotUnderstood:
    """A line of a deploy file off the allowlist of its format."""

    file: str
    line: int
    #: The construct, named (``declare -x``, ``a drop-in's PassEnvironment=``).
    construct: str
    #: What to write instead (empty: :data:`HOW_INSTEAD`).
    fix: str = ""

    @property
    def where(self) -> str:
        """``FILE:LINE``, or ``FILE`` when no line is known (line 0)."""
        return f"{self.file}:{self.line}" if self.line else self.file

    @property
    def message(self) -> str:
        """What is not understood and what to write instead, without where."""
        return f"not understood: {self.construct}; {self.fix or HOW_INSTEAD}"

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass(frozen=True)
class ServerCommand:
    """One llama-server (or ``batch-invariance serve``) a deploy file starts."""

    #: Where it came from, for messages (``deploy.sh:3``, ``compose.yml [llm]``).
    origin: str
    argv: tuple[str, ...]
    #: The environment it runs with, as the shell / systemd / compose would give it.
    env: Mapping[str, str]
    #: Folder relative paths are resolved against; ``None``: the file does not fix it.
    base_dir: Path | None = None
    #: Container-path -> host-path prefixes from compose ``volumes:`` (bind mounts only).
    mounts: tuple[BindMount, ...] = ()
    #: Why ``argv[0]`` names no file on this host (inside a container image); ``None`` when it
    #: does. The build then cannot be checked here.
    binary_elsewhere: str | None = None
    #: The ``PATH`` a bare program name is looked up with, as the file sets it (``None``:
    #: the file sets none, so the caller's decides).
    search_path: str | None = None
    #: Notes for the pass line.
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: The container image it runs in, as the deploy names it (``None``: on the host; in a
    #: container a model path outside every bind mount is not here).
    image: str | None = None


@dataclass(frozen=True)
class DeployRead:
    """What a deploy file starts, and what in it is off the allowlist."""

    commands: tuple[ServerCommand, ...]
    not_understood: tuple[NotUnderstood, ...] = ()

    @property
    def unmodelled(self) -> tuple[str, ...]:
        """Each construct off the allowlist, as one message line."""
        return tuple(str(n) for n in self.not_understood)


def origin_location(origin: str) -> tuple[str, int]:
    """(file, line) of a server's origin as the readers write it: ``FILE:LINE`` (a script, a
    unit or its drop-in), ``FILE [NAME]`` (a compose service, a Kubernetes container: line 0);
    anything else is a file."""
    found = re.fullmatch(r"(.+) \[[^\]]*\]|(.+):(\d+)", origin)
    if found is None:
        return origin, 0
    return (found.group(1), 0) if found.group(1) else (found.group(2), int(found.group(3)))
