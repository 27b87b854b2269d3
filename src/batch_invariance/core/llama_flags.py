"""The one reader of ``llama-server`` flags (pure): argv + env -> :class:`ServerFlags`.

Used by run-live (owned and refused flags, KV cache types), the memory guard and plan-n (cache
types, GPU offload) and check-deploy (the cell a deploy runs, and every flag that changes the
numerics, compared with the argv a cert measured). The rules are llama-server's own, read from
its ``--help`` and ``common/arg.cpp`` / ``tools/server/server.cpp`` (build 11434):

* a flag given on the command line beats its ``LLAMA_ARG_*`` variable; a later
  flag beats an earlier one (``--lora`` accumulates);
* ``-np`` defaults to -1 ("auto"), which the server turns into 4 slots with a unified KV
  cache, whatever ``-kvu``/``-no-kvu`` says;
* booleans read ``on/enabled/true/1`` and ``off/disabled/false/0``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: llama-server's ``-np`` when it is auto (-1) or absent: 4 slots sharing one KV pool.
AUTO_PARALLEL_SLOTS = 4
DEFAULT_CACHE_TYPE = "f16"
_TRUE = frozenset({"on", "enabled", "true", "1"})
_FALSE = frozenset({"off", "disabled", "false", "0"})


class FlagError(ValueError):
    """A flag value llama-server would reject (the caller adds where it came from)."""


@dataclass(frozen=True)
class FlagSpec:
    """One llama-server option: its spellings, whether it takes a value, its env
    variable and, for flags that change the numerics, llama-server's default."""

    key: str
    names: tuple[str, ...]
    takes_value: bool = True
    env: str | None = None
    off_names: tuple[str, ...] = ()
    numerics_default: str | None = None
    accumulates: bool = False

    @property
    def numerics(self) -> bool:
        return self.numerics_default is not None

    @property
    def label(self) -> str:
        return self.names[0]


_UNSET = "unset"
# key | spellings | kind (value, bool, list = accumulates) | LLAMA_ARG_ variable | numerics
# default ("-" = not a numerics flag) | spellings that switch a bool off.
_TABLE = """
model           -m --model                           value MODEL               -      -
hf_repo         -hf -hfr --hf-repo                   value HF_REPO             -      -
hf_file         -hff --hf-file                       value HF_FILE             -      -
model_url       -mu --model-url                      value MODEL_URL           -      -
host            --host                               value HOST                -      -
port            --port                               value PORT                -      -
ctx_size        -c --ctx-size                        value CTX_SIZE            -      -
parallel        -np --parallel                       value N_PARALLEL          -      -
kv_unified      -kvu --kv-unified                    bool  KV_UNIFIED          -      -no-kvu --no-kv-unified
n_predict       -n --predict --n-predict             value N_PREDICT           -      -
slots           --slots                              bool  ENDPOINT_SLOTS      -      --no-slots
cont_batching   -cb --cont-batching                  bool  CONT_BATCHING       -      -nocb --no-cont-batching
cache_reuse     --cache-reuse                        value CACHE_REUSE         -      -
flash_attn      -fa --flash-attn                     value FLASH_ATTN          auto   -
batch           -b --batch-size                      value BATCH               2048   -
ubatch          -ub --ubatch-size                    value UBATCH              512    -
gpu_layers      -ngl --gpu-layers --n-gpu-layers     value N_GPU_LAYERS        auto   -
cache_type_k    -ctk --cache-type-k                  value CACHE_TYPE_K        f16    -
cache_type_v    -ctv --cache-type-v                  value CACHE_TYPE_V        f16    -
cache_ram       --cache-ram -cram                    value CACHE_RAM           8192   -
kv_per_slot     --kv-unified-per-slot                value KV_UNIFIED_PER_SLOT unset  -
backend_samp    -bs --backend-sampling               bool  BACKEND_SAMPLING    off    -
lora            --lora                               list  -                   unset  -
lora_scaled     --lora-scaled                        list  -                   unset  -
control_vector  --control-vector                     list  -                   unset  -
control_scaled  --control-vector-scaled              list  -                   unset  -
draft_model     -md --model-draft --spec-draft-model value SPEC_DRAFT_MODEL    unset  -
draft_hf        -hfd -hfrd --hf-repo-draft --spec-draft-hf value SPEC_DRAFT_HF_REPO  unset  -
spec_type       --spec-type                          value SPEC_TYPE           unset  -
split_mode      -sm --split-mode                     value SPLIT_MODE          layer  -
tensor_split    -ts --tensor-split                   value TENSOR_SPLIT        unset  -
override_tensor -ot --override-tensor                list  OVERRIDE_TENSOR     unset  -
device          -dev --device                        value DEVICE              unset  -
kv_offload      -kvo --kv-offload                    bool  KV_OFFLOAD          on     -nkvo --no-kv-offload
swa_full        --swa-full                           bool  SWA_FULL            off    -
rope_scaling    --rope-scaling                       value ROPE_SCALING_TYPE   unset  -
rope_scale      --rope-scale                         value ROPE_SCALE          unset  -
rope_freq_base  --rope-freq-base                     value ROPE_FREQ_BASE      unset  -
rope_freq_scale --rope-freq-scale                    value ROPE_FREQ_SCALE     unset  -
"""  # noqa: E501 (a table reads better unwrapped)


def _parse_table(text: str) -> tuple[FlagSpec, ...]:
    specs: list[FlagSpec] = []
    for line in text.strip().splitlines():
        key, *rest = line.split()
        kind_at = next(i for i, w in enumerate(rest) if w in ("value", "bool", "list"))
        names, kind = tuple(rest[:kind_at]), rest[kind_at]
        env, default, *off = rest[kind_at + 1 :]
        specs.append(
            FlagSpec(
                key=key,
                names=names,
                takes_value=kind != "bool",
                env=None if env == "-" else "LLAMA_ARG_" + env,
                off_names=() if off == ["-"] else tuple(off),
                numerics_default=None if default == "-" else default,
                accumulates=kind == "list",
            )
        )
    return tuple(specs)


SPECS: tuple[FlagSpec, ...] = _parse_table(_TABLE)
_BY_NAME: dict[str, FlagSpec] = {n: s for s in SPECS for n in (*s.names, *s.off_names)}
_BY_ENV: dict[str, FlagSpec] = {s.env: s for s in SPECS if s.env}
_BY_KEY: dict[str, FlagSpec] = {s.key: s for s in SPECS}
#: Speculative-decoding options not in the table above (there are dozens): any flag with one
#: of these prefixes is compared as a numerics flag under its own name.
_SPECULATIVE_PREFIXES = ("--spec-", "--draft", "--lookup")

#: Flags the driver sets itself on every server it starts; a user ``--server-flag`` may not
#: give them. ``--cache-ram`` is owned (the driver sets 0: no host-side prompt cache, every
#: request computed from scratch, the memory projection honest).
OWNED_FLAGS: frozenset[str] = frozenset(
    n
    for key in ("model", "host", "port", "parallel", "ctx_size", "kv_unified", "cache_ram")
    for n in (*_BY_KEY[key].names, *_BY_KEY[key].off_names)
) | frozenset(_BY_KEY["kv_per_slot"].names)
#: Flags that change what is measured and that the driver will not run with: another model
#: source, no /slots, no continuous batching, KV reuse across requests, a server-side length cap.
REFUSED_FLAGS: frozenset[str] = frozenset(
    {
        *_BY_KEY["hf_repo"].names,
        *_BY_KEY["hf_file"].names,
        *_BY_KEY["model_url"].names,
        "--no-slots",
        "-nocb",
        "--no-cont-batching",
        *_BY_KEY["cache_reuse"].names,
        *_BY_KEY["n_predict"].names,
    }
)


def _bool_text(value: str, flag: str) -> str:
    low = value.strip().lower()
    if low in _TRUE:
        return "on"
    if low in _FALSE:
        return "off"
    raise FlagError(f"{flag} needs on/off (true/false, 1/0), got {value!r}")


def _flash_attn_text(value: str) -> str:
    low = value.strip().lower()
    if low in ("auto", "-1"):
        return "auto"
    return _bool_text(low, "-fa")


def _int(value: str, flag: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise FlagError(f"{flag} needs an integer, got {value!r}") from None


@dataclass(frozen=True)
class ServerFlags:
    """What one llama-server would run with: each known option's value (booleans as
    ``on``/``off``), command line over ``LLAMA_ARG_*`` variables, and every flag name written."""

    values: Mapping[str, str]
    #: Flag names as written on the command line, then the ``LLAMA_ARG_*`` names used.
    given: tuple[str, ...]
    #: Speculative options outside the table (``--spec-draft-n-max`` ...), name -> value.
    speculative: Mapping[str, str]

    def _opt_int(self, key: str) -> int | None:
        raw = self.values.get(key)
        return None if raw is None else _int(raw, _BY_KEY[key].label)

    @property
    def model(self) -> str | None:
        return self.values.get("model")

    @property
    def hf_repo(self) -> str | None:
        return self.values.get("hf_repo")

    @property
    def ctx_size(self) -> int | None:
        return self._opt_int("ctx_size")

    @property
    def parallel(self) -> int | None:
        return self._opt_int("parallel")

    @property
    def n_predict(self) -> int | None:
        return self._opt_int("n_predict")

    @property
    def kv_unified(self) -> bool | None:
        raw = self.values.get("kv_unified")
        return None if raw is None else raw == "on"

    @property
    def cache_type_k(self) -> str:
        return self.values.get("cache_type_k", DEFAULT_CACHE_TYPE)

    @property
    def cache_type_v(self) -> str:
        return self.values.get("cache_type_v", DEFAULT_CACHE_TYPE)

    @property
    def cache_types(self) -> tuple[str, str]:
        return self.cache_type_k, self.cache_type_v

    @property
    def gpu_offload(self) -> bool:
        """True when layers go to a GPU (``-ngl`` > 0, ``all`` or ``auto``)."""
        raw = self.values.get("gpu_layers")
        if raw is None:
            return False
        if raw in ("all", "auto"):
            return True
        try:
            return int(raw) != 0
        except ValueError:
            return False

    def numerics(self) -> dict[str, str]:
        """Every numerics flag with its effective value (llama-server's default when unset),
        keyed by the flag's short spelling; unknown speculative options by their own name."""
        out = {
            s.label: self.values.get(s.key, s.numerics_default or "") for s in SPECS if s.numerics
        }
        out.update(self.speculative)
        return out


def _set(values: dict[str, str], spec: FlagSpec, value: str) -> None:
    if spec.accumulates and spec.key in values:
        values[spec.key] = values[spec.key] + "," + value
    else:
        values[spec.key] = value


def _normalise(spec: FlagSpec, value: str, flag: str) -> str:
    if spec.key == "flash_attn":
        return _flash_attn_text(value)
    if not spec.takes_value:
        return _bool_text(value, flag)
    if spec.key in ("ctx_size", "parallel", "n_predict"):
        _int(value, flag)
    return value


def read_flags(
    argv: Sequence[str], env: Mapping[str, str] | None = None, *, first_is_binary: bool = False
) -> ServerFlags:
    """Read a llama-server argv (and the ``LLAMA_ARG_*`` variables it runs with).

    Tokens that are not options (the binary, stray words) are skipped; an unknown option
    takes no value. Raises :class:`FlagError` for a value llama-server would refuse.
    """
    tokens = list(argv[1:] if first_is_binary else argv)
    values: dict[str, str] = {}
    given: list[str] = []
    speculative: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, inline = token.partition("=")
        spec = _BY_NAME.get(name) if name.startswith("-") else None
        if spec is None:
            if name.startswith(_SPECULATIVE_PREFIXES):
                given.append(name)
                nxt = tokens[i + 1] if i + 1 < len(tokens) else None
                if eq:
                    speculative[name] = inline
                elif nxt is not None and not nxt.startswith("-"):
                    speculative[name] = nxt
                    i += 1
                else:
                    speculative[name] = "on"
            i += 1
            continue
        given.append(name)
        if name in spec.off_names:
            values[spec.key] = "off"
        elif not spec.takes_value:
            values[spec.key] = _bool_text(inline, name) if eq else "on"
        else:
            if eq:
                value = inline
            elif spec.key == "flash_attn" and (
                i + 1 >= len(tokens) or tokens[i + 1].lower() not in (*_TRUE, *_FALSE, "auto", "-1")
            ):
                value = "on"  # older servers: a bare -fa switches it on
            elif i + 1 < len(tokens):
                i += 1
                value = tokens[i]
            else:
                raise FlagError(f"{name} is missing its value")
            _set(values, spec, _normalise(spec, value, name))
        i += 1
    for var, raw in (env or {}).items():
        spec = _BY_ENV.get(var)
        if spec is None or spec.key in values:
            continue
        given.append(var)
        values[spec.key] = _normalise(spec, raw, var)
    return ServerFlags(values=values, given=tuple(given), speculative=speculative)


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


def numerics_differences(deploy: ServerFlags, measured: ServerFlags) -> tuple[str, ...]:
    """Each numerics flag whose effective value differs: ``"-ub 512 (measured 1)"``."""
    ours, theirs = deploy.numerics(), measured.numerics()
    out: list[str] = []
    for name in sorted(set(ours) | set(theirs)):
        a, b = ours.get(name, _UNSET), theirs.get(name, _UNSET)
        if a != b:
            out.append(f"{name} {a} (measured {b})")
    return tuple(out)


def flag_conflicts(flags: Sequence[str] | ServerFlags) -> tuple[str, ...]:
    """The owned or refused flags among user server flags, as written (empty = fine).

    A plain argv is scanned token by token (no values are parsed), so a malformed value
    cannot hide an owned flag."""
    if isinstance(flags, ServerFlags):
        names: Sequence[str] = flags.given
    else:
        names = [t for t in flags if t.partition("=")[0] in OWNED_FLAGS | REFUSED_FLAGS]
        return tuple(names)
    return tuple(n for n in dict.fromkeys(names) if n in OWNED_FLAGS | REFUSED_FLAGS)


def conflict_reason(flag: str) -> str:
    """Why the driver will not take ``flag`` from the user."""
    name = flag.partition("=")[0]
    if name in OWNED_FLAGS:
        return f"{flag} is set by the driver for every server it starts"
    return f"{flag} changes what is measured and is refused"
