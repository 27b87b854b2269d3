"""Split a GGUF file in two, as ``llama-gguf-split --split`` does, for the live tests: the
provisioned build ships no ``llama-gguf-split``, and a real split is what shows that
llama-server opens a split model's other files by name beside the first.

The first file keeps every metadata key and the first half of the tensors; the second holds
only the split keys and the other half. Both carry ``split.no``, ``split.count`` and
``split.tensors.count`` (``llama-model-loader.cpp`` checks ``split.no`` of each file), and the
names end ``-00001-of-00002.gguf`` / ``-00002-of-00002.gguf`` (``llama_split_prefix``).
"""

from __future__ import annotations

import struct
from pathlib import Path

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT16, _INT32, _UINT32 = 8, 9, 2, 5, 4


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def unpack(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def string(self) -> bytes:
        n = self.unpack("<Q")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def skip_value(self, vtype: int) -> None:
        if vtype in _SCALAR_SIZES:
            self.pos += _SCALAR_SIZES[vtype]
        elif vtype == _STRING:
            self.string()
        elif vtype == _ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if etype in _SCALAR_SIZES:
                self.pos += _SCALAR_SIZES[etype] * count
            else:
                for _ in range(count):
                    self.skip_value(etype)
        else:
            raise ValueError(f"unknown GGUF value type {vtype}")


def _kv(key: str, vtype: int, fmt: str, value: int) -> bytes:
    raw = key.encode()
    return struct.pack("<Q", len(raw)) + raw + struct.pack("<I", vtype) + struct.pack(fmt, value)


def _pad(n: int, alignment: int) -> int:
    return (alignment - n % alignment) % alignment


def split_gguf(source: Path, folder: Path, stem: str, *, swap: bool = False) -> tuple[Path, Path]:
    """Write ``folder/STEM-00001-of-00002.gguf`` and ``...-00002-of-00002.gguf`` holding the
    tensors of ``source``; returns both paths. ``swap``: in the second file, each tensor holds
    the weights of the next tensor of its shape and type (another valid model, other answers)."""
    data = source.read_bytes()
    cur = _Cursor(data)
    assert data[:4] == b"GGUF"
    cur.pos = 4
    version, n_tensors, n_kv = cur.unpack("<I"), cur.unpack("<Q"), cur.unpack("<Q")
    kvs_start = cur.pos
    alignment = 32
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.unpack("<I")
        if key == b"general.alignment" and vtype == _UINT32:
            alignment = struct.unpack_from("<I", data, cur.pos)[0]
        cur.skip_value(vtype)
    kvs = data[kvs_start : cur.pos]
    infos: list[tuple[bytes, int]] = []  # (info bytes up to the offset, offset)
    shapes: list[bytes] = []  # dims and type of each tensor
    for _ in range(n_tensors):
        start = cur.pos
        cur.string()
        shape_at = cur.pos
        n_dims = cur.unpack("<I")
        cur.pos += 8 * n_dims + 4
        shapes.append(data[shape_at : cur.pos])
        infos.append((data[start : cur.pos], cur.unpack("<Q")))
    data_start = cur.pos + _pad(cur.pos, alignment)
    ends = [*sorted({offset for _, offset in infos}), len(data) - data_start]
    size = {offset: ends[ends.index(offset) + 1] - offset for _, offset in infos}
    half = n_tensors // 2
    offsets = [offset for _, offset in infos]
    if swap:  # each tensor of the second file takes the weights of the next one of its shape
        groups: dict[bytes, list[int]] = {}
        for k in range(half, n_tensors):
            groups.setdefault(shapes[k], []).append(k)
        for group in groups.values():
            for k, other in zip(group, group[1:] + group[:1], strict=True):
                offsets[k] = infos[other][1]
    paths = []
    tensors = [(info, offsets[k]) for k, (info, _) in enumerate(infos)]
    for no, part in enumerate((tensors[:half], tensors[half:])):
        split_keys = (
            _kv("split.no", _UINT16, "<H", no)
            + _kv("split.count", _UINT16, "<H", 2)
            + _kv("split.tensors.count", _INT32, "<i", n_tensors)
        )
        own_kvs, own_n = (kvs, n_kv) if no == 0 else (b"", 0)
        if no and alignment != 32:
            own_kvs, own_n = _kv("general.alignment", _UINT32, "<I", alignment), 1
        head = b"GGUF" + struct.pack("<IQQ", version, len(part), own_n + 3) + own_kvs + split_keys
        table, body, at = [head], [], 0
        for info, offset in part:
            table.append(info + struct.pack("<Q", at))
            chunk = data[data_start + offset : data_start + offset + size[offset]]
            body += [chunk, b"\0" * _pad(len(chunk), alignment)]
            at += len(chunk) + _pad(len(chunk), alignment)
        header = b"".join(table)
        path = folder / f"{stem}-{no + 1:05d}-of-00002.gguf"
        path.write_bytes(b"".join([header, b"\0" * _pad(len(header), alignment), *body]))
        paths.append(path)
    return paths[0], paths[1]
