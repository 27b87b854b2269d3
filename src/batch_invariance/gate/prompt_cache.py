"""The prompt-cache rule of the deploy gate and of ``serve`` (pure).

llama-server caches prompts unless told not to (``--cache-prompt`` and an 8192 MiB
``--cache-ram`` by default; ``--cache-reuse``, ``--slot-save-path``). A deploy whose server
caches is covered only by a cert that measured the prompt cache (its ``prompt_cache`` block and
the ``cache`` server) with the same settings; a cert without it covers cache-off traffic only.
``serve`` runs what was measured: the cache arm's server, else the B/C server with
``--no-cache-prompt`` added (its ``--cache-ram 0`` is already there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from batch_invariance.cert.provenance import Provenance
from batch_invariance.engines.llama_server.flags import FlagError, ServerFlags, read_flags
from batch_invariance.engines.llama_server.options import DEFAULTS

#: The options this rule decides on (the general option comparison leaves them to it).
CACHE_OPTIONS: tuple[str, ...] = ("--cache-prompt", "--cache-ram", "--cache-reuse",
                                  "--slot-save-path")  # fmt: skip
#: The two ways out, named in every refusal.
FIX = (
    "turn the prompt cache off in the deploy (--no-cache-prompt --cache-ram 0), or re-measure "
    "the cell with the cache on (run-live --cache-arm, with --cache-ram MiB when the deploy "
    "sets one)"
)
NO_CACHE_PROMPT = "--no-cache-prompt"


@dataclass(frozen=True)
class PromptCacheUse:
    """How one server caches prompts: ``why`` is empty when it does not."""

    why: tuple[str, ...]
    #: The settings a measurement must match: canonical option -> value in effect.
    settings: tuple[tuple[str, str], ...]

    @property
    def caches(self) -> bool:
        return bool(self.why)


def _value(flags: ServerFlags, name: str) -> str | None:
    return flags.values.get(name, DEFAULTS.get(name))


def prompt_cache_use(flags: ServerFlags) -> PromptCacheUse:
    """Whether a server started with ``flags`` reuses cached prompt tokens, and why."""
    why: list[str] = []
    prompt = _value(flags, "--cache-prompt") or "on"  # llama-server's default: on
    if prompt != "off":
        given = "--cache-prompt" in flags.values
        why.append("--cache-prompt on" + ("" if given else " (llama-server's default)"))
    ram = _value(flags, "--cache-ram") or "0"
    if ram != "0":
        given = "--cache-ram" in flags.values
        why.append(f"--cache-ram {ram}" + ("" if given else " (llama-server's default)"))
    reuse = flags.values.get("--cache-reuse")
    if reuse is not None and reuse != "0":
        why.append(f"--cache-reuse {reuse}")
    if "--slot-save-path" in flags.values:
        why.append(f"--slot-save-path {flags.values['--slot-save-path']}")
    settings = (
        ("--cache-prompt", prompt),
        ("--cache-ram", ram),
        ("--cache-reuse", reuse or "0"),
        ("--slot-save-path", flags.values.get("--slot-save-path", "(none)")),
    )
    return PromptCacheUse(tuple(why), settings)


def is_cache_difference(line: str) -> bool:
    """A ``numerics_differences`` line about an option this rule decides on."""
    return line.split(" ", 1)[0] in CACHE_OPTIONS


def measured_cache_flags(provenance: Provenance) -> ServerFlags | None:
    """The flags of the prompt-cache arm's server a cert records (``None``: it did not
    measure the prompt cache, or its argv is unreadable: either covers no caching deploy)."""
    server = provenance.cache_server()
    if server is None or not server.argv:
        return None
    try:
        return read_flags(server.argv)
    except FlagError:
        return None


def cache_differences(deploy: ServerFlags, measured_cache: ServerFlags | None) -> tuple[str, ...]:
    """Why the cert does not cover the deploy's prompt cache (empty: it does).

    ``measured_cache`` is :func:`measured_cache_flags` of a cert whose ``prompt_cache``
    block is present, else ``None``."""
    use = prompt_cache_use(deploy)
    if not use.caches:
        return ()
    said = ", ".join(use.why)
    if measured_cache is None:
        return (
            f"the deploy's server caches prompts ({said}) but the cert measured traffic with "
            f"the prompt cache off only; {FIX}",
        )
    measured = dict(prompt_cache_use(measured_cache).settings)
    differ = [
        f"{name} {value} (measured {measured.get(name)})"
        for name, value in use.settings
        if measured.get(name) != value
    ]
    if not differ:
        return ()
    return (
        f"the deploy's prompt cache differs from the one the cert measured: "
        f"{', '.join(differ)}; {FIX}",
    )


def serving_argv(provenance: Provenance, bc_argv: Sequence[str]) -> tuple[str, ...]:
    """What ``serve`` execs before its neutral options: the prompt-cache arm's server argv
    when the cert measured the cache, else ``bc_argv`` with the cache off."""
    server = provenance.cache_server()
    if server is not None and server.argv:
        return tuple(server.argv)
    if NO_CACHE_PROMPT in bc_argv:
        return tuple(bc_argv)
    return (*bc_argv, NO_CACHE_PROMPT)
