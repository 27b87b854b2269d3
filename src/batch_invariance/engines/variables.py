"""Which of the tool's variables a server child gets, and which the cert records (pure).

Every engine's child gets the same three kinds: the neutral variables (they change nothing a
server computes: ``PATH``, ``HOME``, ``LC_*`` ...), the GPU-selection variables (they place
the server; what they selected is recorded as ``provenance.gpus``) and the variables the
engine and its runtimes read (recorded in the cert as ``engine_env``). Which variables an
engine reads, which of those are its options (compared as options, never passed on) and
which config files it would read before its flags are the engine's own
:class:`EnvRules` (:attr:`batch_invariance.engines.base.Engine.env_rules`). A child also gets
``XDG_CONFIG_HOME=/dev/null``, so that no user config file can exist for it.

Some variables are read only by a library the build may not link (``OPENBLAS_*`` by OpenBLAS,
``CUDA_*`` by the CUDA runtime ...): those are an engine's :class:`Runtime` entries, and a
server gets and a cert records them only where its build links that library. Which runtimes a
build links (a set of :attr:`Runtime.name`) is read from its files by the engine
(:meth:`batch_invariance.engines.base.Engine.linked_runtimes`); ``None`` (not known) is every
runtime, the rule before builds were read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from batch_invariance.core.gpu_placement import is_gpu_selection

__all__ = [
    "NEUTRAL_ENV_NAMES",
    "NO_USER_CONFIG",
    "EnvRules",
    "Linked",
    "Runtime",
    "is_neutral_variable",
]

#: Variables that change nothing a server computes (where it listens is in its argv): passed
#: to every server the tool starts, never recorded. ``LC_*`` too. Every other variable of the
#: tool's variables is dropped unless it is one the engine reads (recorded in the cert).
NEUTRAL_ENV_NAMES = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR"}
)
#: What the tool sets ``XDG_CONFIG_HOME`` to: nothing can exist under ``/dev/null``.
NO_USER_CONFIG = "/dev/null"


def is_neutral_variable(name: str) -> bool:
    """A variable that changes nothing the server computes (:data:`NEUTRAL_ENV_NAMES`, ``LC_*``)."""
    return name in NEUTRAL_ENV_NAMES or name.startswith("LC_")


#: The runtimes a build links, by :attr:`Runtime.name`; ``None``: not known (every runtime).
Linked = frozenset[str] | None


@dataclass(frozen=True)
class Runtime:
    """A library a build may link, and the variables it reads once linked."""

    name: str
    #: Library names that mean the build links it: a soname starting with one
    #: (``libopenblas`` is ``libopenblas.so.0``, ``libopenblas64_.so``).
    libraries: tuple[str, ...]
    #: The variables it reads.
    prefixes: tuple[str, ...]
    #: Other runtimes it may load in turn (a BLAS library its OpenMP runtime), by name:
    #: their variables count where this one is linked.
    brings: tuple[str, ...] = ()

    def linked_as(self, soname: str) -> bool:
        """Whether the shared library ``soname`` is this runtime."""
        return soname.startswith(self.libraries)


@dataclass(frozen=True)
class EnvRules:
    """One engine's variables. The default reads none: its child gets only the neutral and
    GPU-selection variables."""

    #: Variables with these prefixes are read by the engine or the runtimes it loads.
    read_prefixes: tuple[str, ...] = ()
    #: Single variables with the same effect (the dynamic loader's ``LD_PRELOAD`` ...).
    read_names: frozenset[str] = frozenset()
    #: Libraries the build may link: their variables are read only where it links them.
    runtimes: tuple[Runtime, ...] = ()
    #: Variables with these prefixes are read as the engine's options (compared as options).
    option_prefixes: tuple[str, ...] = ()
    #: Single variables read as options.
    option_names: frozenset[str] = frozenset()
    #: Config files every server of the engine reads before its flags: a launch is refused
    #: while one exists (what the server ran would differ from the recorded argv).
    system_configs: tuple[str, ...] = ()

    def is_option_variable(self, name: str) -> bool:
        """A variable the engine reads as one of its options (compared as that option)."""
        return name.startswith(self.option_prefixes) or name in self.option_names

    def read_prefixes_of(self, linked: Linked = None) -> tuple[str, ...]:
        """Every prefix a build that links ``linked`` reads (``None``: every runtime's)."""
        if linked is None:
            runtimes = list(self.runtimes)
        else:  # and what the linked runtimes bring in turn
            names = set(linked) | {b for r in self.runtimes if r.name in linked for b in r.brings}
            runtimes = [r for r in self.runtimes if r.name in names]
        return self.read_prefixes + tuple(p for r in runtimes for p in r.prefixes)

    def is_engine_variable(self, name: str, linked: Linked = None) -> bool:
        """A variable the engine or its runtimes read, other than its options and the
        GPU-selection variables (placement: what they select is recorded, not their values).
        ``linked``: the runtimes the build links (a runtime's variables count only where it
        is linked); ``None``: not known, every runtime's count."""
        if self.is_option_variable(name) or is_gpu_selection(name):
            return False
        return name in self.read_names or name.startswith(self.read_prefixes_of(linked))

    def engine_env(self, env: Mapping[str, str], linked: Linked = None) -> dict[str, str]:
        """The variables of ``env`` the engine reads (not its options), sorted by name: a
        runtime's only where the build links it (``linked``; ``None``: every runtime's)."""
        return {k: env[k] for k in sorted(env) if self.is_engine_variable(k, linked)}

    def measured_env(self, parent: Mapping[str, str], linked: Linked = None) -> dict[str, str]:
        """The variables a server the tool measures gets from ``parent``: the neutral
        variables and the ones the engine reads (recorded in the cert as ``engine_env``; a
        runtime's only where the build links it), nothing else (no option variables, no
        ``LD_AUDIT``, ``GLIBC_TUNABLES``, ``MALLOC_*`` ...), and ``XDG_CONFIG_HOME=/dev/null``
        so that no user config file is read."""
        out = {k: v for k, v in parent.items() if self._passed(k, linked)}
        out["XDG_CONFIG_HOME"] = NO_USER_CONFIG
        return out

    def _passed(self, name: str, linked: Linked) -> bool:
        """Passed to every server the tool starts: neutral, engine and GPU-selection variables
        (the selection places the server; what it selected is recorded as ``provenance.gpus``)."""
        return (
            is_neutral_variable(name)
            or self.is_engine_variable(name, linked)
            or is_gpu_selection(name)
        )
