"""``sweep --engine`` over a launched work-alike (the vLLM protocol fake as a stand-in
executable), ``--dry-run`` on another engine, a Hugging Face model folder, and the usage errors
of engine options that cannot apply (``sweep --base-url``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_invariance.cert.verify import verify
from batch_invariance.cli import main
from batch_invariance.run.workset import items_to_row
from tests.support.fakes_live import LOOSE_GATES, hf_model_files
from tests.unit.engines.test_engine_cells import stand_in
from tests.unit.run.test_cell import ITEMS


@pytest.fixture()
def vllm_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A vLLM stand-in that records each launch, a model file and a work-set of 8 prompts."""
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(record))
    monkeypatch.setenv("FAKE_ENGINE_KNOBS", json.dumps({"token_delay_s": 0.005}))
    ws = tmp_path / "ws.json"
    ws.write_text(json.dumps([items_to_row(i) for i in ITEMS]))
    model = hf_model_files(tmp_path)
    return {
        "bin": stand_in(tmp_path, "vllm"),
        "model": model,
        "ws": ws,
        "out": tmp_path / "out",
        "record": record,
    }


def _argv(cell: dict[str, Path], command: str, *extra: str) -> list[str]:
    return [
        command, "--engine", "vllm", "--server-bin", str(cell["bin"]),
        "--model", str(cell["model"]), "--workset", str(cell["ws"]), "--ctx", "512",
        "--gate-passes", "2", "--reps", "1", "--n-predict", "8", "--out-dir", str(cell["out"]),
        *extra,
    ]  # fmt: skip


def _launched(record: Path) -> list[int]:
    rows = [json.loads(line)["argv"] for line in record.read_text().splitlines()]
    return [int(argv[argv.index("--max-num-seqs") + 1]) for argv in rows]


def test_sweep_engine_shares_arm_a_and_launches_one_engine_server_per_n(
    vllm_cell: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(_argv(vllm_cell, "sweep", "--parallel", "2,4", "--no-serial-repeat", *LOOSE_GATES))
    text = capsys.readouterr().out
    assert code == 3, text  # 8 prompts x 2 passes: too few comparisons for GREEN
    # 1 + K launches: the shared one-sequence server, then one server per N.
    assert _launched(vllm_cell["record"]) == [1, 2, 4]
    summary = json.loads((vllm_cell["out"] / "sweep.json").read_text())
    assert summary["parallel"] == [2, 4] and summary["server_launches"] == 3
    for entry in summary["certs"]:
        path = vllm_cell["out"] / entry["file"]
        cert = json.loads(path.read_text())
        prov = cert["provenance"]
        assert cert["source"] == "live" and prov["engine"] == "vllm"
        assert prov["driver"] == "sweep"
        # The guard sizes vLLM's reservation from the folder's config and records it.
        launches = prov["memory_guard"]["launches"]
        assert all(0 < launch["memory_fraction"] <= 1 for launch in launches)
        for server, launch in zip(prov["servers"], launches, strict=False):
            argv = server["argv"]
            flag = argv.index("--gpu-memory-utilization")
            assert argv[flag + 1] == f"{launch['memory_fraction']:g}"
        assert "Hugging Face model folder" in prov["model_file"]["gguf_skipped"]
        assert prov["servers"][1]["argv"][
            prov["servers"][1]["argv"].index("--max-num-seqs") + 1
        ] == str(entry["parallel"])
        assert "shared by the cells N=2, 4" in prov["schedule"]["reference_shared"]
        assert verify(path).problems == ()  # vLLM's own flags read by the identity check
    assert "sweep vllm cell model.safetensors" in text


def test_a_model_folder_runs_without_a_gguf_header_and_never_verifies(
    vllm_cell: dict[str, Path], tmp_path: Path
) -> None:
    folder = hf_model_files(tmp_path / "hf-model").parent
    argv = _argv(vllm_cell, "run-live", "--parallel", "2", "--no-serial-repeat", *LOOSE_GATES)
    argv[argv.index("--model") + 1] = str(folder)
    main(argv)
    (path,) = vllm_cell["out"].glob("*.json")
    prov = json.loads(path.read_text())["provenance"]
    assert prov["model_file"]["sha256"] is None and prov["model_file"]["gguf"] is None
    checked = verify(path)
    assert "no sha256 of the model file is recorded" in " ".join(checked.problems)
    assert not checked.promotable  # a folder has no recorded digest yet: fail closed


def test_dry_run_of_another_engine_prints_its_own_argv_and_launches_nothing(
    vllm_cell: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(_argv(vllm_cell, "run-live", "--parallel", "4", "--dry-run"))
    printed = capsys.readouterr()
    out = printed.out
    # The plan is printed whole; 8 prompts of 8 tokens cannot reach GREEN, which it says.
    assert code == 2 and "this plan cannot reach GREEN: too few distinct prompts" in printed.err
    assert out.startswith("dry run: engine vllm cell model.safetensors ctx=512 N=4")
    assert "-m vllm.entrypoints.openai.api_server" in out
    assert "--max-num-seqs 4 --max-model-len 512" in out
    assert "--port <free>" in out and "--gpu-memory-utilization 0." in out
    assert out.count("  reserves: 0.") == 2 and "sized by the tool" in out
    assert "ETA: unknown" in out
    assert not vllm_cell["record"].exists() and not vllm_cell["out"].exists()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--base-url", "http://127.0.0.1:1"], "sweep cannot take --base-url: an attached"),
        (["--metrics-url", "http://127.0.0.1:1/metrics"], "goes with --base-url"),
        (["--kv-layout", "unified"], "--kv-layout unified applies only to llama-server"),
        (["--server-flag", "--max-num-seqs=8"], "set by the tool for engine vllm"),
    ],
)
def test_sweep_engine_usage_errors_exit_2_with_one_line(
    vllm_cell: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    needle: str,
) -> None:
    code = main(_argv(vllm_cell, "sweep", "--parallel", "2,4", *extra))
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not vllm_cell["record"].exists()


def test_a_gguf_engine_gets_the_memory_guard_before_any_launch(
    vllm_cell: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.fakes_live import dense_meta, write_gguf

    # A model with a chat template: the work-set's message rows go to the chat endpoint.
    meta = dense_meta(**{"tokenizer.chat_template": "{{ x }}"})
    model = write_gguf(tmp_path / "tiny.gguf", meta, padding=1 << 20)
    python = stand_in(tmp_path, "python")
    argv = [
        "run-live", "--engine", "llama-cpp-python", "--server-bin", str(python),
        "--model", str(model), "--workset", str(vllm_cell["ws"]), "--ctx", "512", "--parallel", "2",
        "--max-footprint-gb", "0.0001", "--out-dir", str(vllm_cell["out"]), *LOOSE_GATES,
    ]  # fmt: skip
    # Exit 2 before any launch: the stand-in cannot serve llama-cpp-python, so a launch would
    # have ended in an infrastructure failure (4) instead.
    assert main(argv) == 2
    assert "GuardRefused" in capsys.readouterr().err


def test_an_unknown_engine_in_a_request_is_a_usage_error(tmp_path: Path) -> None:
    from batch_invariance.errors import UsageError
    from batch_invariance.service.live import prepare
    from batch_invariance.service.request import LiveRequest

    with pytest.raises(UsageError, match="unknown --engine 'ollama'; choose one of"):
        prepare(LiveRequest(out_dir=tmp_path, engine="ollama", ctx=512, parallel=2))


def test_an_engine_launcher_symlink_is_kept_as_given(
    vllm_cell: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A venv's bin/python is a symlink; resolving it would run the base interpreter instead.
    link = tmp_path / "venv" / "bin" / "python"
    link.parent.mkdir(parents=True)
    link.symlink_to(vllm_cell["bin"])
    argv = _argv(vllm_cell, "run-live", "--parallel", "2", "--dry-run")
    argv[argv.index("--server-bin") + 1] = str(link)
    assert main(argv) == 2  # the small test cell cannot reach GREEN; its plan is printed whole
    assert f"server A: {link} -m vllm.entrypoints.openai.api_server" in capsys.readouterr().out
