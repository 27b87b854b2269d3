"""The one reader of ``llama-server`` flags (pure): argv + env -> :class:`ServerFlags`.

Used by run-live (owned and refused flags, KV cache types), the memory guard and plan-n (cache
types, GPU offload), check-deploy (the cell a deploy runs, and every option that can change
outputs, compared with the argv a cert measured) and ``serve``. The options are the server's
own table (:mod:`batch_invariance.engines.llama_server.options`, parsed from its ``--help``); the
rules are ``common/arg.cpp``'s (build 11434):

* a word that starts with ``--`` has every ``_`` rewritten to ``-`` before it is looked up
  (``--ctx_size`` is ``--ctx-size``); a word the table does not name is an invalid argument,
  so ``--ctx-size=4096`` and stray words make the server refuse to start;
* ``LLAMA_ARG_*`` variables are read first and the command line overrides them; for a switch
  with an off spelling, ``LLAMA_ARG_NO_*`` set to anything means off; switch values are
  case-sensitive (``on/enabled/true/1``, ``off/disabled/false/0``);
* a value the server reads as a number is understood only in the forms on which its C++ reading
  and this reader's agree (:mod:`~batch_invariance.engines.llama_server.option_values`:
  ``-c 4096``, not ``-c +4096``, ``4_096``, ``04096``, ``0x1000`` or ``4096abc``); any other
  form raises :class:`FlagError`, naming the option and the value;
* ``-np`` defaults to -1 ("auto"), which the server turns into 4 slots with a unified KV
  cache, whatever ``-kvu``/``-no-kvu`` says;
* ``-c`` is padded to a multiple of 256, and a split cache's per-slot share is padded again
  (``src/llama-context.cpp``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from batch_invariance.engines.llama_server.option_values import (
    FALSE,
    TRUE,
    read_int,
    value_problem,
)
from batch_invariance.engines.llama_server.options import (
    ACCUMULATING,
    BY_CANONICAL,
    CELL_OPTIONS,
    DEFAULTS,
    NEUTRAL,
    OPTIONS,
    OWNED,
    RUN_LIVE_SETS,
    OptionClass,
    OptionSpec,
    canonical_spelling,
    lookup,
    option_class,
)

__all__ = [
    "AUTO_PARALLEL_SLOTS",
    "CTX_PAD",
    "DEFAULT_CACHE_TYPE",
    "OWNED_FLAGS",
    "REFUSED_FLAGS",
    "FlagError",
    "GivenOption",
    "PaddedContext",
    "ServerFlags",
    "SlotLayout",
    "flag_conflicts",
    "numerics_differences",
    "padded_context",
    "read_flags",
    "slot_layout",
]


#: llama-server's ``-np`` when it is auto (-1) or absent: 4 slots sharing one KV pool.
AUTO_PARALLEL_SLOTS = 4
DEFAULT_CACHE_TYPE = "f16"
#: ``GGML_PAD(n_ctx, 256)`` in ``llama_context``'s constructor.
CTX_PAD = 256
_TRUE = TRUE
_FALSE = FALSE
_UNSET = "unset"


class FlagError(ValueError):
    """A flag value llama-server would reject (the caller adds where it came from)."""


@dataclass(frozen=True)
class GivenOption:
    """One option a server gets: its canonical name, as written, and where from."""

    canonical: str
    written: str
    from_env: bool

    @property
    def option_class(self) -> OptionClass:
        return option_class(BY_CANONICAL[self.canonical])


@dataclass(frozen=True)
class ServerFlags:
    """What one llama-server would run with: each option's value by canonical name
    (switches as ``on``/``off``), command line over ``LLAMA_ARG_*`` variables."""

    #: Canonical name -> the last value given (the one in effect unless it accumulates).
    values: Mapping[str, str]
    #: Canonical name -> every value given, in order (accumulating options keep them all).
    occurrences: Mapping[str, tuple[str, ...]]
    #: Every option given: command-line words first, then the variables used.
    options: tuple[GivenOption, ...]
    #: Words llama-server rejects as invalid arguments (unknown, ``--x=y``, stray words).
    rejected: tuple[str, ...] = ()

    @property
    def given(self) -> tuple[str, ...]:
        """Option names as written (command line), then the ``LLAMA_ARG_*`` names used."""
        return tuple(o.written for o in self.options)

    def _opt_int(self, key: str) -> int | None:
        raw = self.values.get(key)
        return None if raw is None else _int(raw, key)

    @property
    def model(self) -> str | None:
        return self.values.get("--model")

    @property
    def hf_repo(self) -> str | None:
        return self.values.get("--hf-repo")

    @property
    def model_url(self) -> str | None:
        return self.values.get("--model-url")

    @property
    def ctx_size(self) -> int | None:
        return self._opt_int("--ctx-size")

    @property
    def parallel(self) -> int | None:
        return self._opt_int("--parallel")

    @property
    def n_predict(self) -> int | None:
        return self._opt_int("--predict")

    @property
    def kv_unified(self) -> bool | None:
        raw = self.values.get("--kv-unified")
        return None if raw is None else raw == "on"

    @property
    def cache_type_k(self) -> str:
        return self.values.get("--cache-type-k", DEFAULT_CACHE_TYPE)

    @property
    def cache_type_v(self) -> str:
        return self.values.get("--cache-type-v", DEFAULT_CACHE_TYPE)

    @property
    def cache_types(self) -> tuple[str, str]:
        return self.cache_type_k, self.cache_type_v

    @property
    def gpu_offload(self) -> bool:
        """True when layers go to a GPU (``-ngl`` > 0, ``all`` or ``auto``)."""
        raw = self.values.get("--gpu-layers")
        if raw is None:
            return False
        if raw in ("all", "auto"):
            return True
        return read_int(raw) not in (None, 0)

    def unclassified(self) -> tuple[str, ...]:
        """Options given that are in no class (a deploy giving one is not covered)."""
        return tuple(
            dict.fromkeys(o.written for o in self.options if o.option_class == "unclassified")
        )

    def compared(self) -> dict[str, str]:
        """Every option compared by value (not neutral, not the cell's layout) with what it
        is set to: every value given, joined; llama-server's default or ``unset`` when not
        given."""
        names = {o.canonical for o in self.options} | set(DEFAULTS)
        out: dict[str, str] = {}
        for name in sorted(names):
            if name in NEUTRAL or name in CELL_OPTIONS:
                continue
            given = self.occurrences.get(name)
            if not given:
                out[name] = DEFAULTS.get(name, _UNSET)
            else:
                out[name] = " | ".join(given) if name in ACCUMULATING else given[-1]
        return out

    def numerics(self) -> dict[str, str]:
        """The compared options (the name run-live's provenance and older tests use)."""
        return self.compared()


def _bool_text(value: str, flag: str) -> str:
    if value in _TRUE:
        return "on"
    if value in _FALSE:
        return "off"
    raise FlagError(f"{flag} needs on/off (true/false, 1/0; lower case), got {value!r}")


def _int(value: str, flag: str) -> int:
    number = read_int(value)
    if number is None:
        raise FlagError(f"{flag} {value_problem('--ctx-size', value)}, got {value!r}")
    return number


def _normalise(spec: OptionSpec, value: str, written: str) -> str:
    name = spec.canonical
    problem = value_problem(name, value)
    if problem is not None:  # a form the server could read otherwise than this reader
        raise FlagError(f"{written} {problem}, got {value!r}")
    if name == "--flash-attn":
        if value in ("auto", "-1"):
            return "auto"
        return _bool_text(value, written)
    return value


@dataclass
class _Reading:
    values: dict[str, str]
    occurrences: dict[str, list[str]]
    options: list[GivenOption]

    def put(self, spec: OptionSpec, value: str, written: str, from_env: bool) -> None:
        name = spec.canonical
        self.values[name] = value
        self.occurrences.setdefault(name, []).append(value)
        self.options.append(GivenOption(name, written, from_env))


def _read_env(env: Mapping[str, str], reading: _Reading) -> None:
    for spec in OPTIONS:
        negative = spec.negative_env
        if negative is not None and negative in env:
            reading.put(spec, "off", negative, True)
            continue
        if spec.env is None or spec.env not in env:
            continue
        raw = env[spec.env]
        if spec.nvalues:
            reading.put(spec, _normalise(spec, raw, spec.env), spec.env, True)
        elif spec.negatives:
            reading.put(spec, _bool_text(raw, spec.env), spec.env, True)
        elif raw in _TRUE:
            reading.put(spec, "on", spec.env, True)  # any other value: the server ignores it


def read_flags(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    first_is_binary: bool | None = None,
) -> ServerFlags:
    """Read a llama-server argv (and the variables it runs with) as the server does.

    ``first_is_binary=None``: a first word that is not an option is the program. Words
    llama-server would reject are collected in ``rejected``; a value it would refuse raises
    :class:`FlagError`.
    """
    tokens = list(argv)
    if first_is_binary is None:
        first_is_binary = bool(tokens) and not tokens[0].startswith("-")
    if tokens and first_is_binary:
        tokens = tokens[1:]
    env_reading = _Reading({}, {}, [])
    _read_env(env or {}, env_reading)
    cli = _Reading({}, {}, [])
    rejected: list[str] = []
    i = 0
    while i < len(tokens):
        word = tokens[i]
        spec = lookup(word)
        if spec is None:
            rejected.append(word)
            i += 1
            continue
        if spec.nvalues == 0:
            off = canonical_spelling(word) in spec.negatives
            cli.put(spec, "off" if off else "on", word, False)
            i += 1
            continue
        if i + spec.nvalues >= len(tokens):
            raise FlagError(f"{word} is missing its value")
        value = " ".join(tokens[i + 1 : i + 1 + spec.nvalues])
        cli.put(spec, _normalise(spec, value, word), word, False)
        i += 1 + spec.nvalues
    values = {**env_reading.values, **cli.values}
    occurrences = {**env_reading.occurrences, **cli.occurrences}
    kept_env = [o for o in env_reading.options if o.canonical not in cli.values]
    return ServerFlags(
        values=values,
        occurrences={k: tuple(v) for k, v in occurrences.items()},
        options=(*cli.options, *kept_env),
        rejected=tuple(rejected),
    )


@dataclass(frozen=True)
class SlotLayout:
    """How many slots a server runs and whether they share one KV pool."""

    parallel: int
    kv_unified: bool
    #: True when ``-np`` was absent or -1 (llama-server picked 4 slots, unified).
    auto: bool


def slot_layout(flags: ServerFlags) -> SlotLayout:
    """llama-server's own rule: auto ``-np`` is 4 slots with a unified KV cache (forced, even
    over ``-no-kvu``); otherwise ``-kvu`` decides, split by default."""
    parallel = flags.parallel
    if parallel is None or parallel == -1:
        return SlotLayout(parallel=AUTO_PARALLEL_SLOTS, kv_unified=True, auto=True)
    if parallel < 1:
        raise FlagError(f"-np must be -1 (auto) or at least 1, got {parallel}")
    return SlotLayout(parallel=parallel, kv_unified=bool(flags.kv_unified), auto=False)


@dataclass(frozen=True)
class PaddedContext:
    """The KV cache llama.cpp actually allocates for a ``-c`` (after its padding)."""

    #: The whole pool in tokens.
    pool: int
    #: The context one slot can use (a cert's ``ctx``; for a unified pool, its N-th share).
    per_slot: int


def _pad(n: int) -> int:
    return (n + CTX_PAD - 1) // CTX_PAD * CTX_PAD


def padded_context(n_ctx: int, layout: SlotLayout) -> PaddedContext:
    """``-c`` as llama.cpp pads it: the pool to a multiple of 256, a split cache's per-slot
    share padded again and the pool re-made from it (``-c 4097 -np 4`` is 1280 per slot)."""
    pool = _pad(n_ctx)
    if layout.kv_unified:
        return PaddedContext(pool=pool, per_slot=pool // layout.parallel)
    per_slot = _pad(pool // layout.parallel)
    return PaddedContext(pool=per_slot * layout.parallel, per_slot=per_slot)


def numerics_differences(deploy: ServerFlags, measured: ServerFlags) -> tuple[str, ...]:
    """Each compared option whose value differs: ``"--ubatch-size 512 (measured 1)"``."""
    ours, theirs = deploy.compared(), measured.compared()
    out: list[str] = []
    for name in sorted(set(ours) | set(theirs)):
        a = ours.get(name, DEFAULTS.get(name, _UNSET))
        b = theirs.get(name, DEFAULTS.get(name, _UNSET))
        if a != b:
            out.append(f"{name} {a} (measured {b})")
    return tuple(out)


#: run-live's user ``--server-flag`` may not give these: the driver sets them.
OWNED_FLAGS: frozenset[str] = frozenset(
    n
    for name in (*OWNED, *RUN_LIVE_SETS)
    for n in (*BY_CANONICAL[name].names, *BY_CANONICAL[name].negatives)
)
#: Options that change what is measured and that the driver will not run with: another model
#: source, no /slots, no continuous batching, KV reuse across requests, a server-side length
#: cap. Negative spellings only where the positive is what the driver sets.
REFUSED_FLAGS: frozenset[str] = frozenset(
    {
        *(n for name in ("--hf-repo", "--hf-file", "--model-url", "--docker-repo",
                         "--cache-reuse", "--predict")
          for n in BY_CANONICAL[name].names),
        *BY_CANONICAL["--slots"].negatives,
        *BY_CANONICAL["--cont-batching"].negatives,
    }
)  # fmt: skip


def _conflict_name(word: str) -> str | None:
    name = canonical_spelling(word.partition("=")[0])
    return name if name in OWNED_FLAGS or name in REFUSED_FLAGS else None


def flag_conflicts(flags: Sequence[str] | ServerFlags) -> tuple[str, ...]:
    """The owned or refused flags among user server flags, as written (empty = fine).

    Every word is looked up as llama-server looks it up (``--kv_unified`` is ``--kv-unified``);
    a plain argv is scanned word by word, so a malformed value cannot hide an owned flag."""
    words = flags.given if isinstance(flags, ServerFlags) else flags
    return tuple(dict.fromkeys(w for w in words if _conflict_name(w) is not None))
