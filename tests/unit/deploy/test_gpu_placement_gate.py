"""check-deploy holds a deploy to the GPUs a cert measured on, never to which card: the cert of a
run with ``CUDA_VISIBLE_DEVICES=1 NVIDIA_VISIBLE_DEVICES=all`` on two H200s (a stand-in smi)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batch_invariance.core.gpu_placement import select_gpus
from batch_invariance.deploy.deploy_report import DeployReport, check_cells, load_deploy_cells
from batch_invariance.engines.llama_server.env import engine_env
from batch_invariance.host.gpus import list_gpus
from tests.support import deploy_world as dw
from tests.support.deploy_world import MODEL, OK_FLAGS, Capsys, World, _unsigned, served
from tests.support.nvidia_smi import MIXED, TWO_H200, install_nvidia_smi

MEASURED_ENV = {"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "all"}


def _smi(at: Path, rows: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, code: int = 0) -> None:
    folder = install_nvidia_smi(at / "smi", rows, exit_code=code)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")


@pytest.fixture()
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    model, binary = dw.deploy_files(tmp_path)
    _smi(tmp_path, TWO_H200, monkeypatch)
    measured = select_gpus(list_gpus(), MEASURED_ENV)
    provenance = dw._provenance(model, 4, "split")
    provenance["gpus"] = measured.record()
    recorded = engine_env({**MEASURED_ENV, "GGML_SCHED_MAX_COPIES": "4"})
    for server in provenance["servers"]:
        server["info"] = {"engine_env": recorded}
    certs = tmp_path / "certs"
    dw._live_cert(certs, model, provenance=provenance)
    monkeypatch.setenv("PATH", f"{binary.parent}:{os.environ['PATH']}")
    return {"model": model, "binary": binary, "certs": certs, "root": tmp_path}


def _deploy(world: World, *env: str, serve: bool = False) -> str:
    """The measured server with ``env`` exported, started directly or through serve."""
    exports = "".join(f"export {line}\n" for line in ("GGML_SCHED_MAX_COPIES=4", *env))
    engine = f"llama-server -m {world['model']} {OK_FLAGS}"
    return f"{exports}exec {served(engine, world['certs']) if serve else engine}\n"


def _coverage(world: World, config: Path) -> DeployReport:
    """The cells' coverage, as decided before the rule that a direct launch never passes."""
    return check_cells(config, load_deploy_cells(config).cells, world["certs"], None)


@pytest.mark.parametrize(
    ("rows", "env", "expect", "words"),
    [
        (TWO_H200, ("CUDA_VISIBLE_DEVICES=0",), "raw", ("!GPU",)),  # another card of one model
        (TWO_H200, (), "fail", ("GPUs 2 x NVIDIA H200",)),  # both cards: not what ran
        (TWO_H200, ("CUDA_VISIBLE_DEVICES=-1",), "fail",
         ("GPUs no GPU (measured on 1 x NVIDIA H200",)),
        (MIXED, ("CUDA_VISIBLE_DEVICES=0",), "fail", ("GPUs 1 x NVIDIA A100-SXM4-80GB",)),
    ],
    ids=["another-card", "two-cards", "no-gpu", "another-model"],
)  # fmt: skip
def test_the_gpus_a_deploy_selects_are_held_to_the_measured_ones(
    world: World, tmp_path: Path, capsys: Capsys,
    monkeypatch: pytest.MonkeyPatch, rows: tuple[str, ...], env: tuple[str, ...], expect: str,
    words: tuple[str, ...]
) -> None:  # fmt: skip
    _smi(tmp_path / "rows", rows, monkeypatch)
    code = _unsigned(world, tmp_path, _deploy(world, *env))
    dw.assert_decision(code, capsys.readouterr().out, expect, f"{MODEL} ctx=1024 N=4", *words)
    (check,) = _coverage(world, tmp_path / "llama-server.sh").checks
    assert check.ok is (expect == "raw") and "GPU placement" not in check.reason


def test_a_host_whose_gpus_cannot_be_read_passes_saying_so(
    world: World, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    _smi(tmp_path / "broken", TWO_H200, monkeypatch, code=9)
    unread = "GPU placement not checked: this host's unread (nvidia-smi exited 9"
    code = _unsigned(world, tmp_path, _deploy(world, "CUDA_VISIBLE_DEVICES=0"))
    dw.assert_covered_raw(code, capsys.readouterr().out)
    (check,) = _coverage(world, tmp_path / "llama-server.sh").checks
    assert check.ok and unread in check.reason
    # Through serve it passes, saying so (without CUDA_VISIBLE_DEVICES: check-deploy refuses it
    # on a serve line as a variable reaching serve's Python, though serve hands it on).
    code = _unsigned(world, tmp_path, _deploy(world, serve=True))
    dw.assert_decision(code, capsys.readouterr().out, "pass", f"pass  {MODEL} ctx=1024 N=4", unread)
