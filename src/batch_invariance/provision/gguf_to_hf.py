"""Turn the embedded Gemma 3 GGUF into a Hugging Face model folder that vLLM can load.

Run as a script by the converter venv's interpreter (``PY gguf_to_hf.py GGUF OUT``), never
imported by the tool: it needs ``torch``, ``transformers`` (5.23.0) and ``gguf``, which live
in that venv only. ``transformers`` dequantizes the GGUF to float32 (``gguf_file=``); its
weights are copied into a fresh ``Gemma3ForCausalLM`` built from the same config, because
``save_pretrained`` refuses the GGUF-loaded model itself. The config it writes still names the
GGUF as a ``quantization_config`` (which vLLM rejects: unknown method ``gguf``); the weights
are plain float32, so that entry is removed. The tokenizer is saved beside them. Offline:
nothing is fetched from a hub.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3ForCausalLM

    source = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(**source)
    loaded = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
    fresh = Gemma3ForCausalLM(loaded.config).to(torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # lm_head is tied to the embeddings (a missing key, filled by tie_weights).
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise SystemExit(f"weights do not match: missing {missing}, unexpected {unexpected}")
    fresh.tie_weights()
    fresh.eval()
    out.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    config = out / "config.json"
    data = json.loads(config.read_text())
    data.pop("quantization_config", None)
    config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    # Python put this folder first on sys.path, where our gguf.py would shadow the package.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    if len(sys.argv) != 3:
        raise SystemExit("usage: gguf_to_hf.py GGUF OUT_DIR")
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
