"""``--dry-run`` prints what the one launcher would run: each server's argv from the engine's own
builder (llama-server's KV layout included) and the engine's own KV label."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_invariance.core.plan import Measurement
from batch_invariance.engines.base import KvLayout
from batch_invariance.host.memory import GIB, HostMemory
from batch_invariance.host.node_memory import NodeMemory
from batch_invariance.service.dry_run import dry_run
from batch_invariance.service.live import prepare
from batch_invariance.service.options import LaunchOptions
from batch_invariance.service.request import LiveRequest
from tests.support.fakes_live import dense_meta, fake_server, hf_model_files, write_gguf
from tests.support.golden import check_golden

HOST = HostMemory(mem_available_bytes=8 * GIB, mem_total_bytes=16 * GIB, vram_free_bytes=None)


def _plan(tmp_path: Path, engine: str, kv_layout: KvLayout = "split") -> list[str]:
    ws = tmp_path / "ws.json"
    ws.write_text(json.dumps([{"id": f"p{i}", "prompt": f"say {i}"} for i in range(4)]))
    request = LiveRequest(
        out_dir=tmp_path / "out",
        engine=engine,
        server_bin=fake_server(tmp_path / "bin"),
        model=write_gguf(tmp_path / "tiny.gguf", dense_meta()),
        workset=ws,
        ctx=512,
        parallel=4,
        launch=LaunchOptions(kv_layout=kv_layout),
    )
    return dry_run(prepare(request, create_out_dir=False), HOST, cpus=2).text.splitlines()


def _server_line(lines: list[str], arm: str) -> list[str]:
    (line,) = [ln for ln in lines if ln.startswith(f"server {arm}: ")]
    return line.split()[2:]


def test_a_unified_layout_reaches_the_bc_argv_and_the_serial_server_holds_the_pool(
    tmp_path: Path,
) -> None:
    lines = _plan(tmp_path, "llama-server", "unified")
    assert lines[0].startswith("dry run: cell tiny ctx=512 N=4")
    serial, bc = _server_line(lines, "A"), _server_line(lines, "BC")
    assert "--no-kv-unified" in serial and "--kv-unified" not in serial
    assert "--kv-unified" in bc and "--no-kv-unified" not in bc
    assert bc[bc.index("--ctx-size") + 1] == "2048" and bc[bc.index("--parallel") + 1] == "4"
    # Any slot of the pool may fill it: A's one slot holds the whole pool, so A measures
    # the same long prompts the pool's slots are asked for.
    assert serial[serial.index("--ctx-size") + 1] == "2048"
    kv = [ln for ln in lines if ln.startswith("  kv: ")]
    assert kv[0].startswith("  kv: split:-c 2048 -np 1 ")
    assert kv[1].startswith("  kv: unified:-c 2048 -np 4 -kvu ")
    # A split cell's A server keeps the slot.
    split = _server_line(_plan(tmp_path, "llama-server"), "A")
    assert split[split.index("--ctx-size") + 1] == "512"


def _ladder_plan(tmp_path: Path, kv_layout: KvLayout, n_predict: int) -> list[str]:
    request = LiveRequest(
        out_dir=tmp_path / "out",
        server_bin=fake_server(tmp_path / "bin"),
        model=write_gguf(tmp_path / "tiny.gguf", dense_meta()),
        ctx=512,
        parallel=2,
        measurement=Measurement(n_predict=n_predict, gate_passes=2),
        launch=LaunchOptions(kv_layout=kv_layout),
    )
    return dry_run(prepare(request, create_out_dir=False), HOST, cpus=2).text.splitlines()


def _requests(lines: list[str]) -> int:
    (line,) = [ln for ln in lines if ln.startswith("requests: up to ")]
    return int(line.split()[3])


def test_a_unified_ladder_counts_the_pools_long_prompts(tmp_path: Path) -> None:
    split = _ladder_plan(tmp_path, "split", 32)
    unified = _ladder_plan(tmp_path, "unified", 32)
    assert not [ln for ln in split if ln.startswith("unified pool:")]
    (pool,) = [ln for ln in unified if ln.startswith("unified pool:")]
    assert pool.startswith("unified pool: 4 long prompts targeted at ")
    assert "of the pool's 1024 tokens" in pool and ">= 768, 3/4 of the pool" in pool
    added = int(pool.split("they add ~")[1].split()[0])
    assert 4 * (768 - 32) < added < 4 * 1024
    low, high = (int(x) for x in pool.split(" targeted at ")[1].split()[0].split("-"))
    assert 768 < low <= high < 1024
    assert "work-set: length ladder, 36 distinct prompts" in "\n".join(unified)
    # 4 more items, each sent by A, B, A' and both C passes: 4 x 5 more requests.
    assert _requests(unified) - _requests(split) == 4 * 5


def test_a_pool_too_small_for_3_4_of_it_and_a_companion_is_refused(tmp_path: Path) -> None:
    from batch_invariance.errors import UsageError

    with pytest.raises(UsageError, match="cannot hold sequences of 3/4 of it \\(768 tokens\\)"):
        _ladder_plan(tmp_path, "unified", 128)


def test_an_engine_that_serves_one_request_is_planned_with_its_own_label_and_one_context(
    tmp_path: Path,
) -> None:
    lines = _plan(tmp_path, "llama-cpp-python")
    assert lines[0].startswith("dry run: engine llama-cpp-python cell tiny ctx=512 N=4")
    bc = _server_line(lines, "BC")
    assert bc[1:4] == ["-m", "llama_cpp.server", "--model"] and "--parallel" not in bc
    kv = [ln for ln in lines if ln.startswith("  kv: ")]
    label = "llama-cpp-python:one-context:512 (serves one request at a time)"
    assert [ln.split(";")[0] for ln in kv] == [f"  kv: {label}"] * 2
    # One context whatever N is: the projection of B/C equals that of A.
    assert kv[0].split(";")[1] == kv[1].split(";")[1]


def _golden_plan(tmp_path: Path, request: LiveRequest, host: HostMemory) -> str:
    text = dry_run(prepare(request, create_out_dir=False), host, cpus=2).text
    return text.replace(str(tmp_path.resolve()), "<tmp>").replace(str(tmp_path), "<tmp>")


def _workset(tmp_path: Path) -> Path:
    ws = tmp_path / "ws.json"
    ws.write_text(json.dumps([{"id": f"p{i}", "prompt": f"say {i}"} for i in range(4)]))
    return ws


def test_the_cache_arm_server_is_planned_with_its_cache_ram_in_the_projection(
    tmp_path: Path,
) -> None:
    request = LiveRequest(
        out_dir=tmp_path / "out",
        server_bin=fake_server(tmp_path / "bin"),
        model=write_gguf(tmp_path / "tiny.gguf", dense_meta()),
        workset=_workset(tmp_path),
        ctx=512,
        parallel=4,
        measurement=Measurement(cache_passes=1),
        launch=LaunchOptions(cache_ram=2048),
    )
    text = _golden_plan(tmp_path, request, HOST)
    check_golden("dry_run_cache_arm.txt", text)
    lines = text.splitlines()
    cache = _server_line(lines, "cache")
    assert cache[cache.index("--cache-ram") + 1] == "2048"
    assert "+ prompt cache 2.00 GiB); guard: ok" in text


def test_vllm_is_planned_with_the_sized_reservation_on_every_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    request = LiveRequest(
        out_dir=tmp_path / "out",
        engine="vllm",
        server_bin=fake_server(tmp_path / "bin", "python"),
        model=hf_model_files(tmp_path / "gemma").parent,
        workset=_workset(tmp_path),
        ctx=1024,
        parallel=2,
        measurement=Measurement(cache_passes=1),
    )
    host = HostMemory(8 * GIB, 16 * GIB, None, NodeMemory(0, 16 * GIB, 6 * GIB))
    text = _golden_plan(tmp_path, request, host)
    check_golden("dry_run_vllm.txt", text)
    assert text.count("--gpu-memory-utilization 0.") == 3
    assert text.count("  reserves: ") == 3
