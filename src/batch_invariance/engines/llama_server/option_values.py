"""The value of a llama-server option as the server reads it, in the forms this tool
understands exactly (pure).

``common/arg.cpp`` (build 11434) turns a value into a number with ``std::stoi`` (every option
whose handler takes an ``int``: command line and ``LLAMA_ARG_*`` alike), ``std::stoul`` /
``std::stoull``, ``std::stof`` / ``std::stod``, or compares it with fixed words. Those functions
take forms Python reads otherwise or not at all: ``std::stoi`` reads ``4abc`` as 4, ``0x10``
as 0, `` 4`` and ``+4`` as 4; ``std::stoul`` reads ``-1`` as 2^64-1; ``std::stof`` reads
``1e3``, ``inf``, ``0x1p3``; Python's ``int`` takes ``4_0`` and ``٤``. So only the forms on
which both readings provably agree are understood (``tests/unit/engines/llama_server/
test_option_values.py`` checks each against the C++ functions):

* **int** (``std::stoi``): ``0`` or ``-?[1-9][0-9]*`` within ``int`` (-2^31 .. 2^31-1);
* **uint** (``std::stoul``): ``0`` or ``[1-9][0-9]*`` up to 2^32-1 (no sign: ``-1`` wraps);
* **float** (``std::stof``, ``std::stod``): ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?`` with at most 30
  digits on each side of the point (so no overflow, no subnormal);
* words compared as strings (``on|enabled|true|1``, ``off|disabled|false|0``, ``auto|-1``;
  ``-ngl``: ``auto``, ``all`` or an int);
* lists and pairs of those, with the separators the server splits at (``-ts 3,1``,
  ``-fitt 1024,2048``, ``--lora-scaled a.gguf:0.5``, ``-l 15043+1``, ``-Cr 0-7``).

Anything else (a sign ``+``, blanks, ``_``, leading zeros, hex, an exponent, ``inf``/``nan``,
trailing junk, non-ASCII digits) is refused, naming the option and the value.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Literal

ValueKind = Literal[
    "int", "uint", "float", "layers", "tristate", "bool", "float_list", "uint_list",
    "float_csv", "int_pair", "scaled", "logit_bias", "cpu_range", "cpu_mask", "synth_len",
]  # fmt: skip

_INTS = (
    "--threads --threads-batch --prio --cpu-strict-batch --prio-batch --poll-batch --ctx-size "
    "--kv-unified-per-slot --predict --batch-size --ubatch-size --keep --ctx-checkpoints "
    "--checkpoint-min-step --cache-ram --top-k --repeat-last-n --dry-allowed-length "
    "--dry-penalty-last-n --mirostat --yarn-orig-ctx --parallel --image-min-tokens "
    "--image-max-tokens --mtmd-batch-max-tokens --video-timestamp-interval --n-cpu-moe "
    "--n-cpu-ffn --main-gpu --fit-ctx --embd-normalize --port --timeout --sse-ping-interval "
    "--threads-http --cache-reuse --models-max --reasoning-budget --sleep-idle-seconds "
    "--verbosity --spec-draft-threads --spec-draft-threads-batch --spec-draft-cpu-strict "
    "--spec-draft-prio --spec-draft-poll --spec-draft-cpu-strict-batch --spec-draft-prio-batch "
    "--spec-draft-poll-batch --spec-draft-n-cpu-moe --spec-draft-n-max --spec-draft-n-min "
    "--spec-ngram-mod-n-min --spec-ngram-mod-n-max --spec-ngram-mod-n-match "
    "--spec-ngram-simple-size-n --spec-ngram-simple-size-m --spec-ngram-simple-min-hits "
    "--spec-ngram-map-k-size-n --spec-ngram-map-k-size-m --spec-ngram-map-k-min-hits "
    "--spec-ngram-map-k4v-size-n --spec-ngram-map-k4v-size-m --spec-ngram-map-k4v-min-hits"
)
_FLOATS = (
    "--temp --top-p --min-p --top-nsigma --xtc-probability --xtc-threshold --typical "
    "--repeat-penalty --presence-penalty --frequency-penalty --dry-multiplier --dry-base "
    "--adaptive-target --adaptive-decay --dynatemp-range --dynatemp-exp --mirostat-lr "
    "--mirostat-ent --rope-scale --rope-freq-base --rope-freq-scale --yarn-ext-factor "
    "--yarn-attn-factor --yarn-beta-slow --yarn-beta-fast --video-fps --slot-prompt-similarity "
    "--spec-draft-p-split --spec-draft-p-min"
)
#: How the server reads each option's value, by canonical name (options that take a value and
#: read no number from it, such as paths and names, are not here: compared as strings).
KINDS: dict[str, ValueKind] = {
    **dict.fromkeys(_INTS.split(" "), "int"),
    **dict.fromkeys(_FLOATS.split(" "), "float"),
    "--cpu-strict": "uint", "--poll": "uint", "--seed": "uint",
    "--flash-attn": "tristate", "--reasoning": "tristate", "--fit": "bool",
    "--gpu-layers": "layers", "--spec-draft-ngl": "layers",
    "--tensor-split": "float_list", "--fit-target": "uint_list",
    "--spec-synth-rates": "float_csv", "--spec-synth-len": "synth_len",
    "--control-vector-layer-range": "int_pair", "--logit-bias": "logit_bias",
    "--lora-scaled": "scaled", "--control-vector-scaled": "scaled",
    "--cpu-mask": "cpu_mask", "--cpu-mask-batch": "cpu_mask",
    "--spec-draft-cpu-mask": "cpu_mask", "--spec-draft-cpu-mask-batch": "cpu_mask",
    "--cpu-range": "cpu_range", "--cpu-range-batch": "cpu_range",
    "--spec-draft-cpu-range": "cpu_range",
}  # fmt: skip

TRUE = frozenset({"on", "enabled", "true", "1"})
FALSE = frozenset({"off", "disabled", "false", "0"})
AUTO = frozenset({"auto", "-1"})
INT_MIN, INT_MAX, UINT_MAX = -(2**31), 2**31 - 1, 2**32 - 1
#: ``GGML_MAX_N_THREADS``: a CPU index the range parser accepts is below it.
MAX_THREADS = 512
_DECIMAL = re.compile(r"(0|-?[1-9][0-9]*)")
_UNSIGNED = re.compile(r"(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?(0|[1-9][0-9]{0,29})(\.[0-9]{1,30})?")
_DIGITS = "0123456789"


def _digits(text: str) -> int:
    """The value of ASCII digits (checked by a pattern before: no sign, no other digit)."""
    value = 0
    for char in text:
        value = value * 10 + _DIGITS.index(char)
    return value


def read_int(text: str) -> int | None:
    """``std::stoi`` of ``text`` when it is a canonical int (else ``None``)."""
    if not _DECIMAL.fullmatch(text):
        return None
    value = -_digits(text[1:]) if text.startswith("-") else _digits(text)
    return value if INT_MIN <= value <= INT_MAX else None


def read_uint(text: str, limit: int = UINT_MAX) -> int | None:
    """``std::stoul``/``std::stoull`` of ``text`` when it is a canonical unsigned number."""
    if not _UNSIGNED.fullmatch(text):
        return None
    value = _digits(text)
    return value if value <= limit else None


def read_float(text: str) -> Fraction | None:
    """The exact decimal ``text`` when it is a canonical float (``std::stof`` rounds it to the
    nearest float; no overflow, underflow or subnormal within these digits)."""
    if not _FLOAT.fullmatch(text):
        return None
    negative = text.startswith("-")
    whole, _, fraction = text.lstrip("-").partition(".")
    value = Fraction(_digits(whole)) + Fraction(_digits(fraction or "0"), 10 ** len(fraction))
    return -value if negative else value


def _all(parts: list[str], check: object) -> bool:
    return bool(parts) and all(check(p) is not None for p in parts)  # type: ignore[operator]


def _scaled(value: str) -> bool:
    """``FNAME:SCALE[,FNAME:SCALE...]`` with no quote (``parse_csv_row`` then one ``:``)."""
    if '"' in value:
        return False
    for item in value.split(","):
        name, colon, scale = item.partition(":")
        if not name or not colon or ":" in scale or read_float(scale) is None:
            return False
    return True


def _logit_bias(value: str) -> bool:
    """``TOKEN+BIAS`` / ``TOKEN-BIAS``: an int token, a sign, an unsigned float."""
    match = re.fullmatch(r"(0|[1-9][0-9]*)([+-])(.*)", value)
    if match is None or read_int(match.group(1)) is None:
        return False
    bias = match.group(3)
    return not bias.startswith("-") and read_float(bias) is not None


def _cpu_range(value: str) -> bool:
    start, dash, end = value.partition("-")
    if not dash:
        return False
    return all(
        not part or (read_uint(part) is not None and _digits(part) < MAX_THREADS)
        for part in (start, end)
    )


def value_problem(canonical: str, value: str) -> str | None:
    """What the option ``canonical`` needs when the server's reading of ``value`` is not
    understood here (``needs an integer in decimal ...``; ``None``: it is, or the option reads
    no number)."""
    kind = KINDS.get(canonical)
    if kind is None:
        return None
    ok = {
        "int": lambda: read_int(value) is not None,
        "uint": lambda: read_uint(value) is not None,
        "float": lambda: read_float(value) is not None,
        "synth_len": lambda: read_float(value) not in (None, Fraction(-1)),
        "layers": lambda: value in ("auto", "all") or read_int(value) is not None,
        "tristate": lambda: value in TRUE | FALSE | AUTO,
        "bool": lambda: value in TRUE | FALSE,
        "float_list": lambda: _all(value.split(","), read_float),
        "float_csv": lambda: _all(value.split(","), read_float),
        "uint_list": lambda: _all(value.split(","), read_uint),
        "int_pair": lambda: _all(value.split(" "), read_int) and value.count(" ") == 1,
        "scaled": lambda: _scaled(value),
        "logit_bias": lambda: _logit_bias(value),
        "cpu_range": lambda: _cpu_range(value),
        "cpu_mask": lambda: re.fullmatch(r"(0x)?[0-9a-fA-F]{1,128}", value) is not None,
    }[kind]()
    return None if ok else f"needs {FORMS[kind]}"


#: Each kind's understood forms, said with every refusal.
FORMS: dict[ValueKind, str] = {
    "int": "an integer in decimal (0 or -?[1-9][0-9]*: no sign +, blanks, _, leading zeros, "
    "hex or other digits; within int)",
    "uint": "an integer in decimal (0 or [1-9][0-9]* up to 4294967295, no sign)",
    "float": "a decimal number (-?[0-9]+(.[0-9]+)?, no leading zeros, exponent, inf or nan)",
    "synth_len": "a decimal number other than -1",
    "layers": "auto, all or an integer in decimal",
    "tristate": "on/off (true/false, 1/0, enabled/disabled; lower case) or auto/-1",
    "bool": "on/off (true/false, 1/0, enabled/disabled; lower case)",
    "float_list": "decimal numbers separated by single commas",
    "float_csv": "decimal numbers separated by single commas",
    "uint_list": "integers in decimal separated by single commas",
    "int_pair": "two integers in decimal",
    "scaled": "FILE:SCALE items separated by commas, no quotes",
    "logit_bias": "TOKEN+BIAS or TOKEN-BIAS in decimal",
    "cpu_range": "START-END with CPU indexes in decimal below 512, either may be left out",
    "cpu_mask": "up to 128 hex digits, optionally after 0x",
}

__all__ = ["KINDS", "ValueKind", "read_float", "read_int", "read_uint", "value_problem"]
