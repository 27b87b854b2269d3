"""What a Hugging Face model folder costs in memory: its weight files and KV bytes per token.

Read from the folder itself (``config.json`` and the ``*.safetensors`` / ``*.bin`` weight files),
the way :mod:`batch_invariance.host.gguf` reads a GGUF header; a single weight file is read with
the ``config.json`` beside it. The KV size is an upper bound:
every layer is sized for the full context (a sliding-window layer holds less), at the larger
of the config's dtype and the one the server flags ask for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batch_invariance.errors import UsageError

__all__ = ["DTYPE_BYTES", "HfModelInfo", "read_hf_model"]

#: Bytes per element of the dtypes a config or ``--dtype`` names.
DTYPE_BYTES = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8,
}  # fmt: skip
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


@dataclass(frozen=True)
class HfModelInfo:
    """The numbers the memory projection needs from a model folder."""

    weights_bytes: int
    layers: int
    kv_heads: int
    head_dim: int
    #: The config's dtype (``torch_dtype`` or ``dtype``).
    dtype: str

    def kv_bytes_per_token(self, dtype: str | None = None) -> int:
        """K and V of every layer for one token, at the larger of the config's dtype and
        ``dtype`` (the server's ``--dtype``, where given)."""
        width = max(DTYPE_BYTES.get(self.dtype, 4), DTYPE_BYTES.get(dtype or "", 0))
        return 2 * self.layers * self.kv_heads * self.head_dim * width


def _int(config: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def read_hf_model(folder: Path) -> HfModelInfo:
    """:class:`HfModelInfo` of ``folder``; :class:`UsageError` naming what it could not read
    (without those numbers the memory a server reserves cannot be sized)."""
    what = f"--model {folder}"
    files = [folder] if folder.is_file() else [p for p in folder.iterdir() if p.is_file()]
    if folder.is_file():
        folder = folder.parent
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{what}: cannot read config.json ({exc.__class__.__name__}), so the memory the "
            "server reserves cannot be sized; point --model at a model folder"
        ) from None
    config = raw.get("text_config", raw) if isinstance(raw, dict) else {}
    layers = _int(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(config, "num_attention_heads", "n_head")
    kv_heads = _int(config, "num_key_value_heads") or heads
    hidden = _int(config, "hidden_size", "n_embd")
    head_dim = _int(config, "head_dim") or (hidden // heads if hidden and heads else None)
    if layers is None or kv_heads is None or head_dim is None:
        raise UsageError(
            f"{what}: config.json names no layer count, KV heads or head size, so the KV "
            "cache the server needs cannot be sized"
        )
    weights = sum(p.stat().st_size for p in files if p.suffix in _WEIGHT_SUFFIXES)
    if weights == 0:
        raise UsageError(f"{what}: no weight files (*.safetensors, *.bin) in the folder")
    named = (c.get(k) for c in (config, raw) for k in ("torch_dtype", "dtype"))
    dtype = next((str(d) for d in named if isinstance(d, str) and d), "float32")
    return HfModelInfo(weights, layers, kv_heads, head_dim, dtype)
