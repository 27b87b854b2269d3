"""A model folder's memory numbers: weight files on disk, KV bytes per token from config.json
(every layer at full context, the wider of the config's and the flags' dtype)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_invariance.errors import UsageError
from batch_invariance.host.hf_model import read_hf_model
from tests.support.fakes_live import hf_model_files


def test_gemma_geometry_gives_36_kib_per_token_at_float32(tmp_path: Path) -> None:
    weights = hf_model_files(tmp_path / "m")
    info = read_hf_model(weights.parent)
    assert info.weights_bytes == len(b"weights")
    # K and V x 18 layers x 1 KV head x 256 x 4 bytes.
    assert info.kv_bytes_per_token() == 2 * 18 * 256 * 4 == 36864
    assert info.kv_bytes_per_token("bfloat16") == 36864  # never below the config's width
    assert read_hf_model(weights) == info  # a weight file is read with its folder's config


def test_a_wider_dtype_on_the_command_line_widens_the_kv(tmp_path: Path) -> None:
    folder = hf_model_files(tmp_path / "m").parent
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    info = read_hf_model(folder)
    assert info.kv_bytes_per_token() == 18432
    assert info.kv_bytes_per_token("float32") == 36864


@pytest.mark.parametrize(
    ("config", "says"),
    [(None, "cannot read config.json"), ({}, "no layer count"), ({"num_hidden_layers": 2}, "no")],
)
def test_a_folder_it_cannot_size_is_a_usage_error(
    tmp_path: Path, config: dict[str, int] | None, says: str
) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"w")
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match=says):
        read_hf_model(folder)
