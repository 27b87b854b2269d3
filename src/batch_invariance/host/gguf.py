"""Read what the memory guard and the cert need from a GGUF file's header.

Only the metadata block is parsed (never the tensors): the architecture, layer count,
attention geometry (for the KV-cache estimate) and the expert count (so a mixture-of-experts
model is detected from the file, not from its name). Its sha256 is
:mod:`batch_invariance.host.facts`'s.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from batch_invariance.errors import UsageError

__all__ = [
    "CACHE_TYPE_BYTES",
    "CHAT_TEMPLATE_KEY",
    "GgufInfo",
    "parse_info",
    "read_metadata",
]

_MAGIC = b"GGUF"

# GGUF metadata value types -> struct format (scalars only).
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING = 8
_ARRAY = 9

#: Bytes per element of each KV-cache type llama.cpp accepts (block size folded in).
CACHE_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}


@dataclass(frozen=True)
class GgufInfo:
    """The header facts batch-invariance uses. Geometry values are per model, not per slot."""

    path: Path
    file_size: int
    version: int
    architecture: str
    name: str | None
    block_count: int
    embedding_length: int
    head_count: int
    #: KV heads summed over layers (handles per-layer arrays); ``head_count_kv * block_count``
    #: when the header gives one number.
    kv_heads_total: int
    key_length: int
    value_length: int
    expert_count: int
    context_length: int | None
    #: ``sliding_window`` when the model declares one (informational: the estimate stays
    #: conservative and sizes every layer for the full context).
    sliding_window: int | None
    #: ``tokenizer.chat_template``; ``None`` for a model without one (a base model): on the
    #: chat endpoint llama-server then falls back to ChatML (core/chat_template.py).
    chat_template: str | None = None

    @property
    def is_moe(self) -> bool:
        return self.expert_count > 0

    def kv_bytes_per_token(self, cache_type_k: str = "f16", cache_type_v: str = "f16") -> float:
        """KV-cache bytes one token of context costs across all layers."""
        bk = CACHE_TYPE_BYTES.get(cache_type_k.lower(), 2.0)
        bv = CACHE_TYPE_BYTES.get(cache_type_v.lower(), 2.0)
        return self.kv_heads_total * (self.key_length * bk + self.value_length * bv)

    def summary(self) -> dict[str, Any]:
        """JSON-ready facts for the cert's provenance."""
        return {
            "architecture": self.architecture,
            "name": self.name,
            "gguf_version": self.version,
            "block_count": self.block_count,
            "embedding_length": self.embedding_length,
            "head_count": self.head_count,
            "kv_heads_total": self.kv_heads_total,
            "key_length": self.key_length,
            "value_length": self.value_length,
            "expert_count": self.expert_count,
            "is_moe": self.is_moe,
            "context_length": self.context_length,
            "sliding_window": self.sliding_window,
            "file_size": self.file_size,
        }


class _Reader:
    """Buffered little-endian reader over a file (the tokenizer arrays are large)."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._buf = b""
        self._pos = 0

    def _need(self, n: int) -> None:
        avail = len(self._buf) - self._pos
        if avail >= n:
            return
        chunk = self._fh.read(max(n - avail, 1 << 20))
        self._buf = self._buf[self._pos :] + chunk
        self._pos = 0
        if len(self._buf) < n:
            raise EOFError("truncated GGUF header")

    def take(self, n: int) -> bytes:
        self._need(n)
        out = self._buf[self._pos : self._pos + n]
        self._pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        (value,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += size
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > 1 << 30:
            raise ValueError("implausible string length in GGUF header")
        return self.take(n).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.unpack("<Q")
        if n > 1 << 30:
            raise ValueError("implausible string length in GGUF header")
        self.take(n)

    def value(self, vtype: int, keep: bool) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            if keep:
                return self.string()
            self.skip_string()
            return None
        if vtype == _ARRAY:
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            if etype in _SCALARS and not keep:
                self.take(struct.calcsize(_SCALARS[etype]) * count)
                return None
            items = [self.value(etype, keep) for _ in range(count)]
            return items if keep else None
        raise ValueError(f"unknown GGUF value type {vtype}")


#: The one tokenizer key kept: whether the model carries its own chat template.
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"


def _wanted(key: str) -> bool:
    # Keep everything except the (huge) tokenizer tables.
    return key == CHAT_TEMPLATE_KEY or not key.startswith("tokenizer.")


def read_metadata(path: str | Path) -> tuple[int, dict[str, Any]]:
    """(GGUF version, metadata key -> value) without tokenizer tables.

    Raises :class:`UsageError` when the file is missing or not a GGUF file.
    """
    p = Path(path)
    try:
        fh = p.open("rb")
    except OSError as exc:
        raise UsageError(f"cannot read model {p}: {exc.strerror or exc}") from None
    with fh:
        reader = _Reader(fh)
        try:
            if reader.take(4) != _MAGIC:
                raise UsageError(f"model {p} is not a GGUF file (bad magic); pass a .gguf model")
            version = reader.unpack("<I")
            if version < 2:
                raise UsageError(f"model {p}: GGUF version {version} is too old; re-convert it")
            reader.unpack("<Q")  # tensor count
            n_kv = reader.unpack("<Q")
            meta: dict[str, Any] = {}
            for _ in range(n_kv):
                key = reader.string()
                vtype = reader.unpack("<I")
                keep = _wanted(key)
                value = reader.value(vtype, keep)
                if keep:
                    meta[key] = value
        except (EOFError, ValueError, struct.error) as exc:
            raise UsageError(f"model {p}: unreadable GGUF header ({exc})") from None
    return version, meta


def _int(meta: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = meta.get(key)
    if isinstance(value, bool):
        value = None
    if isinstance(value, int):
        return int(value)
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return max(int(v) for v in value)
    if default is None:
        raise KeyError(key)
    return default


def parse_info(path: str | Path) -> GgufInfo:
    """The :class:`GgufInfo` of a model file (header only)."""
    p = Path(path)
    version, meta = read_metadata(p)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise UsageError(f"model {p}: GGUF header has no general.architecture")
    try:
        blocks = _int(meta, f"{arch}.block_count")
        embd = _int(meta, f"{arch}.embedding_length")
        heads = _int(meta, f"{arch}.attention.head_count")
    except KeyError as exc:
        raise UsageError(f"model {p}: GGUF header lacks {exc.args[0]}") from None
    kv_raw = meta.get(f"{arch}.attention.head_count_kv", heads)
    per_layer = isinstance(kv_raw, list)
    kv_total = sum(int(v) for v in kv_raw) if per_layer else int(kv_raw) * blocks
    head_dim = embd // heads if heads else 0
    key_len = _int(meta, f"{arch}.attention.key_length", head_dim)
    value_len = _int(meta, f"{arch}.attention.value_length", head_dim)
    ctx_len = meta.get(f"{arch}.context_length")
    swa = meta.get(f"{arch}.attention.sliding_window")
    name = meta.get("general.name")
    template = meta.get(CHAT_TEMPLATE_KEY)
    return GgufInfo(
        path=p,
        file_size=p.stat().st_size,
        version=int(version),
        architecture=arch,
        name=name if isinstance(name, str) else None,
        block_count=blocks,
        embedding_length=embd,
        head_count=heads,
        kv_heads_total=kv_total,
        key_length=key_len,
        value_length=value_len,
        expert_count=_int(meta, f"{arch}.expert_count", 0),
        context_length=int(ctx_len) if isinstance(ctx_len, int) else None,
        sliding_window=int(swa) if isinstance(swa, int) else None,
        chat_template=template if isinstance(template, str) and template.strip() else None,
    )
