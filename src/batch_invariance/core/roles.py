"""The role of a server in a cell (pure): what a launcher is asked to start, and what a
cert's ``provenance.servers[].role`` records (as the same strings)."""

from __future__ import annotations

from enum import Enum

from batch_invariance.core.evidence import ARM_CACHE

__all__ = ["ServerRole"]


class ServerRole(str, Enum):
    """``A``: the ``--parallel 1`` reference (arm A and its serial repeat A'); ``BC``: the
    ``--parallel N`` server under test (arm B and the C passes); ``cache``: the prompt-cache
    arm's ``--parallel N`` server, with the prompt cache on."""

    A = "A"
    BC = "BC"
    CACHE = ARM_CACHE

    def __str__(self) -> str:
        # The recorded string (a log name, a label, a cert's role), on every Python.
        return self.value

    @property
    def under_test(self) -> bool:
        """Started at ``--parallel N`` (B/C or the prompt-cache arm), not the reference."""
        return self is not ServerRole.A
