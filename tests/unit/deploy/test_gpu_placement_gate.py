"""check-deploy holds a deploy to the GPUs a cert measured on, never to which card it was.

The cert's provenance is what a run records with ``CUDA_VISIBLE_DEVICES=1
NVIDIA_VISIBLE_DEVICES=all`` in its environment on a two-H200 host: no selection variable among
the engine variables, GPU 1's facts as ``gpus``. ``nvidia-smi`` is a stand-in on PATH.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.core.gpu_placement import select_gpus
from batch_invariance.deploy.deploy_report import DeployReport, check_cells, load_deploy_cells
from batch_invariance.host.gpus import list_gpus
from tests.support.nvidia_smi import MIXED, TWO_H200, install_nvidia_smi
from tests.unit.deploy.test_check_deploy import (
    MODEL,
    OK_FLAGS,
    _live_cert,
    _provenance,
    _unsigned,
    assert_covered_raw,
    deploy_files,
    served,
)

MEASURED_ENV = {"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "all"}


def _smi(
    tmp_path: Path, rows: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, code: int = 0
) -> None:
    folder = install_nvidia_smi(tmp_path / "smi", rows, exit_code=code)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")


@pytest.fixture()
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    from batch_invariance.engines.llama_server.env import engine_env

    model, binary = deploy_files(tmp_path)
    _smi(tmp_path, TWO_H200, monkeypatch)
    measured = select_gpus(list_gpus(), MEASURED_ENV)
    provenance = _provenance(model, 4, "split")
    provenance["gpus"] = measured.record()
    recorded = engine_env({**MEASURED_ENV, "GGML_SCHED_MAX_COPIES": "4"})
    for server in provenance["servers"]:
        server["info"] = {"engine_env": recorded}
    certs = tmp_path / "certs"
    _live_cert(certs, model, provenance=provenance)
    monkeypatch.setenv("PATH", f"{binary.parent}:{os.environ['PATH']}")
    return {"model": model, "binary": binary, "certs": certs, "root": tmp_path}


def _deploy(world: dict[str, Path], *env: str, serve: bool = False) -> str:
    """The measured server with ``env`` exported, started directly or (``serve``) through
    ``batch-invariance serve``."""
    exports = "".join(f"export {line}\n" for line in ("GGML_SCHED_MAX_COPIES=4", *env))
    engine = f"llama-server -m {world['model']} {OK_FLAGS}"
    return f"{exports}exec {served(engine, world['certs']) if serve else engine}\n"


def _coverage(world: dict[str, Path], config: Path) -> DeployReport:
    """The coverage of the deploy's cells, as check-deploy decides it before the rule that a
    server started directly never passes (issue 40)."""
    return check_cells(config, load_deploy_cells(config).cells, world["certs"], None)


def test_the_selection_is_not_an_engine_variable_but_what_it_selected_is_recorded(
    world: dict[str, Path],
) -> None:
    import json

    (cert,) = world["certs"].glob("*.json")
    provenance = json.loads(cert.read_text())["provenance"]
    assert provenance["servers"][1]["info"]["engine_env"] == {"GGML_SCHED_MAX_COPIES": "4"}
    assert [d["name"] for d in provenance["gpus"]["devices"]] == ["NVIDIA H200"]


def test_another_card_of_the_same_model_passes(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _unsigned(world, tmp_path, _deploy(world, "CUDA_VISIBLE_DEVICES=0"))
    out = capsys.readouterr().out
    assert_covered_raw(code, out)  # started directly: covered, never a pass (issue 40)
    assert f"FAIL  {MODEL} ctx=1024 N=4" in out and "GPU" not in out
    # The cell's coverage, as the gate decides it before the launch rule.
    (check,) = _coverage(world, tmp_path / "llama-server.sh").checks
    assert check.ok and check.reason.startswith("promotable cert: ")
    assert "GPU placement" not in check.reason


def test_another_gpu_model_count_or_a_cpu_fails(
    world: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _unsigned(world, tmp_path, _deploy(world)) == exitcodes.NOT_PROMOTABLE
    assert "GPUs 2 x NVIDIA H200" in capsys.readouterr().out  # both cards: not what ran
    hidden = _deploy(world, "CUDA_VISIBLE_DEVICES=-1")
    assert _unsigned(world, tmp_path, hidden) == exitcodes.NOT_PROMOTABLE
    assert "GPUs no GPU (measured on 1 x NVIDIA H200" in capsys.readouterr().out
    _smi(tmp_path / "mixed", MIXED, monkeypatch)
    code = _unsigned(world, tmp_path, _deploy(world, "CUDA_VISIBLE_DEVICES=0"))
    assert code == exitcodes.NOT_PROMOTABLE
    assert "GPUs 1 x NVIDIA A100-SXM4-80GB" in capsys.readouterr().out


def test_a_host_whose_gpus_cannot_be_read_passes_saying_so(
    world: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _smi(tmp_path / "broken", TWO_H200, monkeypatch, code=9)
    unread = "GPU placement not checked: this host's unread (nvidia-smi exited 9"
    code = _unsigned(world, tmp_path, _deploy(world, "CUDA_VISIBLE_DEVICES=0"))
    assert_covered_raw(code, capsys.readouterr().out)
    (check,) = _coverage(world, tmp_path / "llama-server.sh").checks
    assert check.ok and unread in check.reason
    # Started through serve it passes, saying so. (No CUDA_VISIBLE_DEVICES here: check-deploy
    # refuses it on a serve line as a variable reaching serve's Python, though serve hands the
    # selection to the engine.)
    code = _unsigned(world, tmp_path, _deploy(world, serve=True))
    out = capsys.readouterr().out
    assert code == exitcodes.PROMOTABLE, out
    assert f"pass  {MODEL} ctx=1024 N=4" in out and unread in out
