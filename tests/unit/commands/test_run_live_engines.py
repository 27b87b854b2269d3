"""``run-live --base-url`` (attach mode) and ``run-live --engine`` through the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance.cert.identity import identity_problems
from batch_invariance.cert.provenance import Provenance
from batch_invariance.cert.verify import verify
from batch_invariance.cli import main
from batch_invariance.engines.registry import recorded_launch
from batch_invariance.mock import MockKnobs, MockServer
from batch_invariance.run.workset import items_to_row
from tests.support.fakes_live import LOOSE_GATES, hf_model_files
from tests.unit.engines.test_engine_cells import stand_in
from tests.unit.run.test_cell import ITEMS


@pytest.fixture()
def workset(tmp_path: Path) -> Path:
    path = tmp_path / "ws.json"
    path.write_text(json.dumps([items_to_row(i) for i in ITEMS]))
    return path


@pytest.fixture()
def open_workset(tmp_path: Path) -> Path:
    """32 distinct open prompts: enough independent rows and long enough answers for a GREEN
    under the default policy (>= 30 distinct prompts, median answer >= 64 tokens)."""
    path = tmp_path / "open.json"
    rows = [
        {"id": f"n{k}", "prompt": f"Write a short note about batch number {k}."} for k in range(32)
    ]
    path.write_text(json.dumps(rows))
    return path


def _cell(workset: Path, out: Path, *extra: str) -> list[str]:
    return [
        "run-live", "--workset", str(workset), "--ctx", "512", "--parallel", "4",
        "--gate-passes", "4", "--n-predict", "16", "--out-dir", str(out), *extra,
    ]  # fmt: skip


def test_attached_red_exits_1_and_records_attach(
    workset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with MockServer(parallel=4, ctx=512, knobs=MockKnobs(cobatch_divergence=True)) as server:
        code = main(_cell(workset, tmp_path / "out", "--base-url", server.base_url, *LOOSE_GATES))
    out = capsys.readouterr().out
    assert code == 1, out
    (cert_path,) = (tmp_path / "out").glob("*.json")
    cert = json.loads(cert_path.read_text())
    assert cert["source"] == "attached" and cert["verdict"] == "RED"
    assert cert["provenance"]["attach"]["base_url"] == server.base_url
    assert cert["provenance"]["attach"]["allow_remote"] is False
    assert "arm A not available" in cert["provenance"]["attach"]["arm_a"]


def test_attached_clean_exits_as_not_promotable(workset: Path, tmp_path: Path) -> None:
    with MockServer(parallel=4, ctx=512) as server:
        code = main(_cell(workset, tmp_path / "out", "--base-url", server.base_url, *LOOSE_GATES))
    assert code != 0  # GREEN-looking evidence on an attached server is never promotable
    (cert_path,) = (tmp_path / "out").glob("*.json")
    assert json.loads(cert_path.read_text())["source"] == "attached"


def test_launched_vllm_fake_through_the_cli(
    open_workset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    exe = stand_in(tmp_path, "vllm")
    model = hf_model_files(tmp_path)
    # The 32 short notes fill a 128-token slot (the sequence scope of a GREEN).
    argv = _cell(open_workset, tmp_path / "out", "--engine", "vllm", "--server-bin", str(exe),
                 "--model", str(model), "--n-predict", "128", "--ctx", "128")  # fmt: skip
    code = main(argv)
    (cert_path,) = (tmp_path / "out").glob("*.json")
    cert = json.loads(cert_path.read_text())
    assert cert["source"] == "live" and cert["provenance"]["engine"] == "vllm"
    assert code == 0, cert["decision_reasons"]
    bc = cert["provenance"]["servers"][1]
    assert bc["info"]["numerics_env"] == {"VLLM_BATCH_INVARIANT": "1"}
    # The identity check reads vLLM's own flags (--max-num-seqs, --max-model-len, serve M).
    checked = verify(cert_path)
    assert checked.problems == () and checked.promotable
    # A relabelled BC server (one sequence where the cert claims N=4) is caught per engine.
    assert checked.cert is not None
    prov = checked.cert.provenance.record()
    argv = prov["servers"][1]["argv"]
    argv[argv.index("--max-num-seqs") + 1] = "1"
    relabel = replace(checked.cert, provenance=Provenance.from_record(prov))
    found = identity_problems(relabel, recorded_launch)
    assert any("dispatch_n 4 but server BC" in p for p in found)
    prov["engine"] = "ollama"
    unknown = replace(checked.cert, provenance=Provenance.from_record(prov))
    found = identity_problems(unknown, recorded_launch)
    assert "engine 'ollama' is not one this tool launches" in found
    cert["provenance"]["engine"] = "ollama"
    relabelled = tmp_path / "relabelled.json"
    relabelled.write_text(json.dumps(cert))
    assert verify(relabelled).problems  # digest and identity no longer hold


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--base-url", "http://10.1.2.3:8080"], "pass --allow-remote"),
        (["--base-url", "http://127.0.0.1:1", "--server-flag", "-np"], "no effect on an attached"),
        (
            ["--metrics-url", "http://127.0.0.1:1/metrics", "--engine", "vllm"],
            "goes with --base-url",
        ),
        (["--engine", "vllm"], "--server-bin and --model are required for --engine vllm"),
        (
            ["--engine", "vllm", "--server-flag", "--enable-prefix-caching"],
            "changes what is measured",
        ),
        (["--base-url", "http://127.0.0.1:1", "--dry-run"], "--dry-run is not available"),
        (
            ["--base-url", "http://127.0.0.1:1", "--kv-layout", "unified"],
            "--kv-layout unified applies only to llama-server launched by the tool",
        ),
        (
            ["--engine", "llama-cpp-python", "--kv-layout", "unified"],
            "--kv-layout unified applies only to llama-server launched by the tool",
        ),
        (
            ["--ctx", "1000"],
            "--ctx 1000: llama-server rounds the context per slot up to a multiple of 256, so "
            "it would run 1024 and the cert would not name what ran; use --ctx 768 or 1024",
        ),
        # vLLM takes its context as given: the same --ctx passes on to the next check.
        (["--engine", "vllm", "--ctx", "1000"], "--server-bin and --model are required"),
        (
            ["--engine", "vllm", "--profile", "spark"],
            "--profile works only with the default engine (llama-server, launched)",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    workset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
    needle: str,
) -> None:  # fmt: skip
    code = main(_cell(workset, tmp_path / "out", *extra))
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not list((tmp_path / "out").glob("*.json"))


def test_attach_to_nothing_exits_4(workset: Path, tmp_path: Path) -> None:
    from batch_invariance.servers import ports

    port = ports.pick_free(frozenset())
    url = f"http://127.0.0.1:{port}"
    assert main(_cell(workset, tmp_path / "out", "--base-url", url, *LOOSE_GATES)) == 4
