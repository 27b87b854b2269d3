"""A small GGUF that travels: random weights for a seed, a real tokenizer, about 12 MB.

The embedded Gemma file (about 242 MB) cannot go where only tens of MB can be carried (a GPU
machine reached with the repository and a few files). Batch invariance is a numeric question,
so random weights serve: :func:`make_small_model` writes a ``llama``-architecture GGUF (4
layers, 256 wide, grouped-query attention, Q8_0 matrices as quantised deployments use) whose
tokenizer is copied verbatim from a vocab file the pinned llama.cpp sdist ships
(``models/ggml-vocab-phi-3.gguf``: SentencePiece, 32064 tokens, with its chat template), so
prompts tokenize as that model's do and the chat endpoint has a real template.

It is written with the ``gguf`` library of the same pinned sdist (``gguf-py``, loaded from the
verified, unpacked sdist: the writer and the server are one version, and no new dependency is
needed; it needs numpy and PyYAML, both dependencies already). Weights come from numpy's PCG64
bit stream (stable across numpy versions by its policy), mapped to uniform values with integer
and float32 arithmetic only, so one seed gives the same bytes on any host. The output rows of
every control and user-defined token (end of turn, end of text, padding) are zero: their logit
is 0 while the largest of the 32000 others is positive, so greedy answers never end early and
fill the length the cell asks for.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from batch_invariance.errors import InfraError, UsageError
from batch_invariance.host.facts import sha256_file
from batch_invariance.provision.embedded import Layout, Say
from batch_invariance.provision.sdist import extract_sdist, fetch_sdist

__all__ = [
    "DEFAULT_VOCAB",
    "SmallModel",
    "SmallShape",
    "ensure_sdist_tree",
    "load_gguf",
    "make_small_model",
    "small_model_name",
]

#: The vocab file (under the sdist's ``llama.cpp/models``) whose tokenizer the model copies.
DEFAULT_VOCAB = "phi-3"
#: token_type values whose output rows stay random: NORMAL and BYTE (SentencePiece byte fallback).
_KEEP_TYPES = (1, 6)


@dataclass(frozen=True)
class SmallShape:
    """The model's dimensions (each matrix dimension a multiple of Q8_0's 32-value block)."""

    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 768
    n_layer: int = 4
    ctx_train: int = 4096

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass(frozen=True)
class SmallModel:
    path: Path
    sha256: str
    size: int
    seed: int
    vocab: str


def small_model_name(seed: int, vocab: str = DEFAULT_VOCAB) -> str:
    return f"small-llama-{vocab}-seed{seed}.gguf"


def ensure_sdist_tree(layout: Layout, say: Say) -> Path:
    """The unpacked pinned sdist's ``llama.cpp`` folder (downloaded and verified if missing)."""
    sdist = fetch_sdist(layout.sdist, say, dict(os.environ))
    return extract_sdist(sdist, layout.src_dir) / "llama.cpp"


def load_gguf(llama_cpp: Path) -> ModuleType:
    """The sdist's ``gguf`` package (``gguf-py/gguf``), imported under the name ``gguf``."""
    init = llama_cpp / "gguf-py" / "gguf" / "__init__.py"
    loaded = sys.modules.get("gguf")
    if loaded is not None:
        if Path(str(getattr(loaded, "__file__", ""))).resolve() == init.resolve():
            return loaded
        raise InfraError(
            f"another gguf package is already imported ({getattr(loaded, '__file__', '?')}); "
            "make the small model in a fresh process"
        )
    spec = importlib.util.spec_from_file_location("gguf", init, submodule_search_locations=[
        str(init.parent)])  # fmt: skip
    if spec is None or spec.loader is None or not init.is_file():
        raise InfraError(f"{init} is missing: the unpacked sdist is incomplete; re-provision")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gguf"] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        del sys.modules["gguf"]
        raise InfraError(
            f"the sdist's gguf library needs {exc.name}: pip install {exc.name}"
        ) from None
    return module


class _Weights:
    """Uniform values in [-bound, bound] from one PCG64 bit stream (host-independent bytes)."""

    def __init__(self, seed: int) -> None:
        self._bits = np.random.PCG64(seed)

    def uniform(self, shape: tuple[int, ...], bound: float) -> np.ndarray[Any, Any]:
        raw = self._bits.random_raw(int(np.prod(shape)))
        ints = (raw >> np.uint64(40)).astype(np.int64) - (1 << 23)  # 24-bit, centred
        scale = np.float32(bound / float(1 << 23))
        values: np.ndarray[Any, Any] = (ints.astype(np.float32) * scale).reshape(shape)
        return values


def _copy_tokenizer(gguf: ModuleType, vocab: Path, writer: Any) -> tuple[int, np.ndarray[Any, Any]]:
    """Copy every ``tokenizer.*`` field of ``vocab``; returns (n_vocab, token types)."""
    reader = gguf.GGUFReader(str(vocab))
    types = None
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        writer.add_key_value(key, value, vtype, sub_type=sub)
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
        if key == "tokenizer.ggml.token_type":
            types = np.asarray(value, dtype=np.int32)
    if not n_vocab or types is None:
        raise InfraError(f"{vocab} has no tokenizer.ggml.tokens/token_type; not a vocab file")
    return n_vocab, types


def _header(gguf: ModuleType, writer: Any, shape: SmallShape, n_vocab: int, name: str) -> None:
    writer.add_name(name)
    writer.add_context_length(shape.ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _tensors(
    gguf: ModuleType, writer: Any, shape: SmallShape, n_vocab: int, types: np.ndarray[Any, Any],
    seed: int,
) -> None:  # fmt: skip
    w = _Weights(seed)
    q8 = gguf.GGMLQuantizationType.Q8_0
    d, kv = shape.n_embd, shape.n_head_kv * shape.head_dim

    def matrix(name: str, rows: int, cols: int) -> None:
        data = w.uniform((rows, cols), float(np.sqrt(3.0 / cols)))  # std 1/sqrt(fan-in)
        if name == "token_embd.weight":  # tied output: zero rows never win the argmax
            data[~np.isin(types, _KEEP_TYPES)] = 0.0
        writer.add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8)

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(d, dtype=np.float32))

    matrix("token_embd.weight", n_vocab, d)
    norm("output_norm.weight")
    for i in range(shape.n_layer):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", d, d)
        matrix(f"blk.{i}.attn_k.weight", kv, d)
        matrix(f"blk.{i}.attn_v.weight", kv, d)
        matrix(f"blk.{i}.attn_output.weight", d, d)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", shape.n_ff, d)
        matrix(f"blk.{i}.ffn_up.weight", shape.n_ff, d)
        matrix(f"blk.{i}.ffn_down.weight", d, shape.n_ff)


def make_small_model(
    llama_cpp: Path,
    out: Path,
    seed: int = 0,
    vocab: str = DEFAULT_VOCAB,
    shape: SmallShape = SmallShape(),
) -> SmallModel:
    """Write the small model for ``seed`` to ``out`` (atomically) from the unpacked sdist at
    ``llama_cpp``; the same seed, vocab and shape give the same bytes."""
    if seed < 0 or seed >= 2**63:
        raise UsageError(f"--seed {seed} is out of range; give 0 .. 2**63-1")
    vocab_file = llama_cpp / "models" / f"ggml-vocab-{vocab}.gguf"
    if not vocab_file.is_file():
        raise UsageError(f"no vocab file {vocab_file.name} in the sdist; give e.g. {DEFAULT_VOCAB}")
    gguf = load_gguf(llama_cpp)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    try:
        n_vocab, types = _copy_tokenizer(gguf, vocab_file, writer)
        _header(
            gguf, writer, shape, n_vocab, f"batch-invariance small llama ({vocab}, seed {seed})"
        )
        _tensors(gguf, writer, shape, n_vocab, types, seed)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)
    return SmallModel(out, sha256_file(out), out.stat().st_size, seed, vocab)
