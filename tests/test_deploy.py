"""The deploy gate: config parsing (pure) and `check-deploy` against real cert files.

The promotable cert comes from a real driver run against the loopback mock with the verdict
really decided by the core; only its ``source`` is set to ``live`` by this fixture (the
driver's ``finish_cell`` takes the source from its caller), because no live GREEN can be
earned in a unit test and the gate must be shown passing as well as failing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from batch_invariance.deploy.gate import (
    cell_from_flags,
    command_lines,
    kv_types_of,
    load_deploy_config,
    model_key,
    toml_entries,
)
from batch_invariance.errors import UsageError

MODEL = "gemma-3-270m-q4_k_m"


# --------------------------------------------------------------------------- parsing


def test_llama_server_defaults_apply_when_flags_are_absent() -> None:
    cell = cell_from_flags(["llama-server", "-m", f"/m/{MODEL}.gguf", "-c", "8192"], "x:1")
    # No -np: llama-server's auto = 4 slots with a unified KV cache, so each slot may use all.
    assert (cell.parallel, cell.kv_unified, cell.ctx) == (4, True, 8192)
    assert cell.names == (MODEL,)
    split = cell_from_flags(["-m", "a.gguf", "-c", "8192", "-np", "4"], "x:1")
    assert (split.parallel, split.kv_unified, split.ctx) == (4, False, 2048)
    unified = cell_from_flags(["-m", "a.gguf", "--ctx-size=8192", "--parallel=4", "-kvu"], "x")
    assert (unified.ctx, unified.kv_unified) == (8192, True)
    serial = cell_from_flags(["--model", "a.gguf", "-c", "4096", "-np", "1"], "x")
    assert (serial.parallel, serial.ctx, serial.needs_cert) == (1, 4096, False)
    unknown = cell_from_flags(["-m", "/nowhere/a.gguf", "-np", "2"], "x")
    assert unknown.ctx is None, "ctx 0 = the model's training context, unknown without the file"
    later_wins = cell_from_flags(["-m", "a.gguf", "-c", "1", "-c", "64", "-np", "2"], "x")
    assert later_wins.ctx == 32


def test_environment_variable_forms_are_read_and_flags_win() -> None:
    cell = cell_from_flags(
        ["LLAMA_ARG_MODEL=/m/b.gguf", "LLAMA_ARG_CTX_SIZE=4096", "LLAMA_ARG_N_PARALLEL=2",
         "llama-server", "-c", "2048"],
        "env",
    )  # fmt: skip
    assert (cell.names[0], cell.parallel, cell.ctx) == ("b", 2, 1024)


def test_kv_cache_types_are_read_from_flags_and_environment() -> None:
    plain = cell_from_flags(["-m", "a.gguf", "-c", "4096", "-np", "2"], "x")
    assert plain.kv_types == ("f16", "f16")
    quant = cell_from_flags(
        ["-m", "a.gguf", "-np", "2", "-ctk", "q8_0", "--cache-type-v=q4_0"], "x"
    )
    assert quant.kv_types == ("q8_0", "q4_0")
    env = cell_from_flags(["LLAMA_ARG_CACHE_TYPE_K=q8_0", "llama-server", "-m", "a.gguf"], "e")
    assert env.kv_types == ("q8_0", "f16")
    assert kv_types_of(["llama-server", "--cache-type-k", "bf16", "-ctv", "bf16"]) == (
        "bf16",
        "bf16",
    )


def test_bad_values_are_one_line_usage_errors() -> None:
    with pytest.raises(UsageError, match=r"deploy.sh:3: -np needs an integer"):
        cell_from_flags(["-m", "a.gguf", "-np", "four"], "deploy.sh:3")
    with pytest.raises(UsageError, match="no model"):
        cell_from_flags(["llama-server", "-c", "4096"], "deploy.sh:1")
    with pytest.raises(UsageError, match="missing its value"):
        cell_from_flags(["-m", "a.gguf", "-c"], "x")


def test_command_lines_join_continuations_and_skip_comments() -> None:
    text = (
        "#!/bin/sh\n"
        "# start two servers\n"
        "exec /opt/bin/llama-server \\\n"
        "  -m /srv/a.gguf \\\n"
        "  -c 8192 -np 4 &   # batched\n"
        "echo hello\n"
        "ExecStart=/usr/bin/llama-server --model /srv/b.gguf -c 4096 -np 1\n"
    )
    found = command_lines(text, "run.sh")
    assert [origin for origin, _ in found] == ["run.sh:3", "run.sh:7"]
    cells = [cell_from_flags(tokens, origin) for origin, tokens in found]
    assert [(c.names[0], c.ctx, c.parallel) for c in cells] == [("a", 2048, 4), ("b", 4096, 1)]


def test_models_toml_entries_merge_default_and_model_flags() -> None:
    data = {
        "defaults": {"server_bin": "/x/llama-server", "server_flags": ["-c", "8192"]},
        "models": [
            {"alias": "small", "gguf": "{MODELS_DIR}/small.gguf", "server_flags": ["-np", "2"]},
            {"alias": "big", "gguf": "{MODELS_DIR}/big.gguf", "server_flags": "-np 1"},
        ],
    }
    entries = toml_entries(data, "models.toml")
    assert entries[0].flags == ("-c", "8192", "-np", "2")
    cell = cell_from_flags(
        entries[0].flags, entries[0].origin, model=entries[0].gguf, alias="small"
    )
    # A file stem and an alias that coincide are one name.
    assert (cell.names, cell.ctx, cell.parallel) == (("small",), 4096, 2)
    quant = toml_entries(
        {"models": [{"alias": "q", "gguf": "q.gguf", "kv": "q8_0", "server_flags": ["-np", "2"]}]},
        "models.toml",
    )[0]
    assert cell_from_flags(quant.flags, quant.origin, model=quant.gguf).kv_types == ("q8_0",) * 2
    with pytest.raises(UsageError, match=r"models.toml \[bad\]: missing gguf"):
        toml_entries({"models": [{"alias": "bad"}]}, "models.toml")
    with pytest.raises(UsageError, match="no \\[\\[models\\]\\] entries"):
        toml_entries({"defaults": {}}, "models.toml")


def test_model_key_matches_paths_names_and_stems() -> None:
    assert model_key("/srv/models/Gemma.GGUF") == "Gemma"
    assert model_key("gemma") == "gemma"
    assert model_key("{MODELS_DIR}/x/y.gguf") == "y"


def test_config_without_any_server_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "deploy.sh"
    config.write_text("echo nothing here\n")
    with pytest.raises(UsageError, match="no llama-server command line"):
        load_deploy_config(config)


# --------------------------------------------------------------------------- check-deploy


def _run_mock_cell(out_dir: Path, source: str, model: str, parallel: int) -> Path:
    from importlib import resources

    from batch_invariance.core.evidence import CellSpec, GatePolicy
    from batch_invariance.engines.mock import MockKnobs, MockLauncher
    from batch_invariance.run.cell import CellPlan, finish_cell, run_cell
    from batch_invariance.run.workset import load_workset
    from batch_invariance.scorer_api import load_scorer

    ref = resources.files("batch_invariance").joinpath("data/worksets/mock.json")
    with resources.as_file(ref) as path:
        workset = load_workset(path)
    plan = CellPlan(items=workset.items, ctx=1024, parallel=parallel, gate_passes=4, n_predict=128)
    # A test-only fake that claims to spawn real servers is the only way to get a promotable
    # cert without a batch-invariant live server. The verdict is still the core's.
    launcher = _claims_live_launcher() if source == "live" else MockLauncher(MockKnobs())
    run = run_cell(plan, launcher, load_scorer(None))  # type: ignore[arg-type]
    spec = CellSpec(model=model, ctx=1024, dispatch_n=parallel, kv_label=run.kv_label, reps=1)
    finished = finish_cell(run, spec, GatePolicy(), {"test": "deploy"}, out_dir)
    return finished.path


def _claims_live_launcher() -> object:
    from typing import Literal

    from batch_invariance.engines.mock import MockKnobs, MockLauncher

    class ClaimsLiveLauncher(MockLauncher):
        source: Literal["live", "mock"] = "live"

    return ClaimsLiveLauncher(MockKnobs())


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A certs folder: a promotable cell (ctx 1024, N 4) and a mock cell (ctx 1024, N 2)."""
    out = tmp_path_factory.mktemp("certs")
    green = _run_mock_cell(out, "live", MODEL, 4)
    assert json.loads(green.read_text())["status"] == "green"
    _run_mock_cell(out / "mock", "mock", MODEL, 2)
    return out


def _deploy(tmp_path: Path, body: str) -> Path:
    config = tmp_path / "llama-server.sh"
    config.write_text(body)
    return config


def test_check_deploy_passes_when_every_batched_cell_is_promotable(
    certs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _deploy(
        tmp_path,
        f"llama-server -m /srv/{MODEL}.gguf -c 4096 -np 4\n"
        f"llama-server -m /srv/{MODEL}.gguf -c 1024 -np 1\n",
    )
    assert main(["check-deploy", str(config), "--certs", str(certs)]) == exitcodes.PROMOTABLE
    out = capsys.readouterr().out
    assert f"pass  {MODEL} ctx=1024 N=4" in out
    assert "parallel 1: no batching" in out
    assert "check-deploy: PASS" in out


def test_check_deploy_fails_a_cell_whose_kv_cache_types_the_cert_did_not_measure(
    certs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _deploy(tmp_path, f"llama-server -m /srv/{MODEL}.gguf -c 4096 -np 4 -ctk q8_0\n")
    assert main(["check-deploy", str(config), "--certs", str(certs)]) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert f"FAIL  {MODEL} ctx=1024 N=4" in out
    assert "measured with KV cache types (K/V) f16/f16" in out and "runs q8_0/f16" in out


def test_check_deploy_names_every_missing_and_failing_cell(
    certs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _deploy(
        tmp_path,
        f"llama-server -m /srv/{MODEL}.gguf -c 4096 -np 4\n"  # certified
        f"llama-server -m /srv/{MODEL}.gguf -c 2048 -np 2\n"  # only a mock cert
        f"llama-server -m /srv/{MODEL}.gguf -c 8192 -np 8\n"  # no cert at all
        "llama-server -m /srv/other.gguf -c 4096 -np 4\n",  # another model
    )
    code = main(["check-deploy", str(config), "--certs", str(certs)])
    assert code == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert f"pass  {MODEL} ctx=1024 N=4" in out
    assert f"FAIL  {MODEL} ctx=1024 N=2" in out and "not promotable (GREEN, source=mock" in out
    assert f"FAIL  {MODEL} ctx=1024 N=8" in out and "no cert for" in out
    assert "FAIL  other ctx=1024 N=4" in out
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("check-deploy: FAIL: 3 of 4 batched cell(s) not certified")
    for label in (f"{MODEL} ctx=1024 N=2", f"{MODEL} ctx=1024 N=8", "other ctx=1024 N=4"):
        assert label in summary


def test_check_deploy_default_parallel_needs_a_cert(
    certs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No -np: llama-server runs 4 slots with a unified KV cache; each slot may use all 1024.
    config = _deploy(tmp_path, f"llama-server -m /srv/{MODEL}.gguf -c 1024\n")
    assert main(["check-deploy", str(config), "--certs", str(certs)]) == exitcodes.PROMOTABLE
    config = _deploy(tmp_path, f"llama-server -m /srv/{MODEL}.gguf -c 2048\n")
    assert main(["check-deploy", str(config), "--certs", str(certs)]) == exitcodes.NOT_PROMOTABLE
    assert "no cert for" in capsys.readouterr().out


def test_check_deploy_reads_models_toml(certs: Path, tmp_path: Path) -> None:
    config = tmp_path / "models.toml"
    config.write_text(
        '[defaults]\nserver_flags = ["-c", "4096"]\n\n'
        f'[[models]]\nalias = "g"\ngguf = "{{MODELS_DIR}}/{MODEL}.gguf"\n'
        'server_flags = ["-np", "4"]\n'
    )
    args = ["check-deploy", str(config), "--certs", str(certs), "--models-dir", "/srv"]
    assert main(args) == exitcodes.PROMOTABLE
    config.write_text(config.read_text().replace('"-np", "4"', '"-np", "2"'))
    assert main(args) == exitcodes.NOT_PROMOTABLE


def test_check_deploy_fails_a_tampered_cert_as_invalid(
    certs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "certs"
    shutil.copytree(certs, folder)
    cert = next(p for p in folder.glob("*.json"))
    data = json.loads(cert.read_text())
    data["sensitivity"]["n_hot_trials"] += 1000
    cert.write_text(json.dumps(data, sort_keys=True, indent=2))
    config = _deploy(tmp_path, f"llama-server -m /srv/{MODEL}.gguf -c 4096 -np 4\n")
    assert main(["check-deploy", str(config), "--certs", str(folder)]) == exitcodes.CERT_INVALID
    assert "is invalid" in capsys.readouterr().out


def test_check_deploy_with_bundle_identity_requires_a_signature(
    certs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _deploy(tmp_path, f"llama-server -m /srv/{MODEL}.gguf -c 4096 -np 4\n")
    code = main(
        ["check-deploy", str(config), "--certs", str(certs), "--offline",
         "--bundle-identity", "https://github.com/o/r/.github/workflows/cell.yml@refs/tags/v0"]
    )  # fmt: skip
    assert code == exitcodes.CERT_INVALID
    assert "signature bundle missing" in capsys.readouterr().out


def test_check_deploy_usage_errors(certs: Path, tmp_path: Path) -> None:
    config = _deploy(tmp_path, f"llama-server -m /srv/{MODEL}.gguf -c 4096 -np 4\n")
    assert main(["check-deploy", str(config), "--certs", str(tmp_path / "nope")]) == 2
    assert main(["check-deploy", str(tmp_path / "missing.sh"), "--certs", str(certs)]) == 2
    assert main(["check-deploy", str(config), "--certs", str(certs), "--repository", "o/r"]) == 2
