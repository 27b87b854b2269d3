"""The engine adapters: launch argv, owned/refused flags, Prometheus witnesses, cache evidence."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from batch_invariance.engines import witness
from batch_invariance.engines.base import LaunchRequest, flag_conflicts
from batch_invariance.engines.llama_cpp_python import LlamaCppPythonEngine
from batch_invariance.engines.llama_server.engine import LlamaServerEngine
from batch_invariance.engines.registry import DEFAULT_ENGINE, ENGINES, engine_for
from batch_invariance.engines.sglang import SglangEngine
from batch_invariance.engines.vllm import VllmEngine
from batch_invariance.errors import UsageError
from tests.support.engine_fakes import fake_engine

M = Path("/models/m")

PROM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a \\"quoted\\" name"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2 1700000000000
vllm:broken_line
vllm:nan_gauge NaN
sglang:num_running_reqs 4
"""


def test_prometheus_text_is_parsed_with_labels_and_series_summed() -> None:
    samples = witness.parse_prometheus(PROM)
    assert [s.name for s in samples] == [
        "vllm:num_requests_running", "vllm:num_requests_running", "sglang:num_running_reqs",
    ]  # fmt: skip
    assert samples[0].labels == {"engine": "0", "model_name": 'a \\"quoted\\" name'}
    assert witness.metric_total(samples, "vllm:num_requests_running") == 5.0
    assert witness.metric_total(samples, "vllm:absent") is None
    assert witness.gauge_reader("vllm:num_requests_running")(PROM) == 5
    assert witness.gauge_reader("vllm:num_requests_running")("") is None
    assert witness.gauge_reader("vllm:num_requests_running")({"not": "text"}) is None


def test_histogram_share_above_a_bound() -> None:
    text = (
        'h_bucket{le="1.0"} 6\nh_bucket{le="8.0"} 9\nh_bucket{le="+Inf"} 10\nh_count 10\nh_sum 40\n'
    )
    hist = witness.histogram(text, "h")
    assert hist is not None and hist.count == 10 and hist.total == 40
    assert hist.share_above(1.0) == pytest.approx(0.4)
    assert witness.histogram(text, "absent") is None
    assert witness.Histogram({}, 0.0, 0.0).share_above(1.0) is None


def req(server_bin: str, **kw: object) -> LaunchRequest:
    base: dict[str, object] = {
        "server_bin": Path(server_bin), "model": M, "parallel": 4, "ctx": 2048,
        "host": "127.0.0.1", "port": 9000,
    }  # fmt: skip
    base.update(kw)
    return LaunchRequest(**base)  # type: ignore[arg-type]


def test_launch_argv_of_each_engine() -> None:
    vllm = VllmEngine().launch_command(req("py", env={"VLLM_BATCH_INVARIANT": "1"}))
    assert vllm.argv == (
        "py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m",
        "--max-num-seqs", "4", "--max-model-len", "2048", "--no-enable-prefix-caching",
        "--enable-prompt-tokens-details", "--host", "127.0.0.1", "--port", "9000",
    )  # fmt: skip
    assert vllm.env == {"VLLM_BATCH_INVARIANT": "1"} and vllm.ready_path == "/health"
    assert VllmEngine().provenance(vllm)["batch_invariant_mode"] is True
    sg = SglangEngine().launch_command(req("py", extra_flags=("--enable-deterministic-inference",)))
    assert sg.argv == (
        "py", "-m", "sglang.launch_server", "--model-path", "/models/m",
        "--max-running-requests", "4", "--context-length", "2048", "--disable-radix-cache",
        "--enable-metrics", "--host", "127.0.0.1", "--port", "9000",
        "--enable-deterministic-inference",
    )  # fmt: skip
    assert SglangEngine().provenance(sg)["deterministic_inference"] is True
    assert (
        SglangEngine().provenance(SglangEngine().launch_command(req("py")))[
            "deterministic_inference"
        ]
        is False
    )
    lcp = LlamaCppPythonEngine().launch_command(req("py"))
    assert lcp.argv == (
        "py", "-m", "llama_cpp.server", "--model", "/models/m", "--n_ctx", "2048",
        "--host", "127.0.0.1", "--port", "9000",
    )  # fmt: skip
    assert lcp.ready_path == "/v1/models"
    ls = LlamaServerEngine().launch_command(req("llama-server"))
    assert ls.argv[ls.argv.index("--parallel") + 1] == "4"
    assert ls.argv[ls.argv.index("--ctx-size") + 1] == str(4 * 2048)


def test_env_without_the_switch_passes_nothing() -> None:
    cmd = VllmEngine().launch_command(req("vllm", env={"HOME": "/root"}))
    assert cmd.env == {}
    assert VllmEngine().provenance(cmd)["batch_invariant_mode"] is False


def test_the_cpu_builds_openmp_runtime_is_preloaded_from_the_interpreters_venv(
    tmp_path: Path,
) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to("/usr/bin/python3")  # a venv's interpreter links out of the venv
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "LD_PRELOAD": "/lib/other.so", "HOME": "/root"}
    assert VllmEngine().launch_command(req(str(python), env=env)).env == {
        "VLLM_CPU_KVCACHE_SPACE": "2"
    }  # no libiomp5.so in this venv: nothing preloaded
    lib = tmp_path / "venv" / "lib" / "libiomp5.so"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    cmd = VllmEngine().launch_command(req(str(python), env=env))
    assert cmd.env == {"VLLM_CPU_KVCACHE_SPACE": "2", "LD_PRELOAD": f"{lib}:/lib/other.so"}
    assert VllmEngine().provenance(cmd)["numerics_env"] == cmd.env


@pytest.mark.parametrize(
    ("engine", "flag", "why"),
    [
        ("vllm", "--max-num-seqs=8", "set by the tool"),
        ("vllm", "--enable-prefix-caching", "changes what is measured"),
        ("sglang", "--context-length", "set by the tool"),
        ("llama-cpp-python", "--cache", "changes what is measured"),
        ("llama-server", "--no-cont-batching", "changes what is measured"),
        ("llama-server", "-np", "set by the tool"),
    ],
)
def test_owned_and_refused_flags(engine: str, flag: str, why: str) -> None:
    (problem,) = flag_conflicts(engine_for(engine), [flag, "--harmless"])
    assert why in problem and engine in problem


def test_registry_names_and_unknown_engine() -> None:
    assert set(ENGINES) == {"llama-server", "llama-cpp-python", "vllm", "sglang"}
    assert DEFAULT_ENGINE == "llama-server"
    with pytest.raises(UsageError, match="unknown --engine 'ollama'; choose one of"):
        engine_for("ollama")


def test_only_the_negative_control_offers_no_witness() -> None:
    base = "http://127.0.0.1:1"
    assert LlamaCppPythonEngine().busy_probes(base) == ()
    assert [p.url for p in VllmEngine().busy_probes(base)] == [base + "/metrics"]
    assert [p.url for p in SglangEngine().busy_probes(base, "http://127.0.0.1:2/m")] == [
        "http://127.0.0.1:2/m"
    ]
    assert [p.label for p in LlamaServerEngine().busy_probes(base)] == ["slots", "metrics"]


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_fake_metrics_feed_the_witness_and_cache_evidence(name: str) -> None:
    engine = engine_for(name)
    with fake_engine(name, parallel=2) as server:
        text = requests.get(server.base_url + "/metrics", timeout=5).text
        (probe,) = engine.busy_probes(server.base_url)
        assert probe.read(text) == 0
        evidence = engine.cache_evidence(text)
        assert evidence.hits_seen is False and evidence.counters
        assert requests.get(server.base_url + "/slots", timeout=5).status_code == 404
    with fake_engine(name, parallel=2, witness=False) as server:
        text = requests.get(server.base_url + "/metrics", timeout=5).text
        assert probe.read(text) is None


def test_cache_hits_are_seen() -> None:
    assert VllmEngine().cache_evidence("vllm:prefix_cache_hits_total 12\n").hits_seen is True
    assert SglangEngine().cache_evidence("sglang:cache_hit_rate 0.25\n").hits_seen is True
    assert VllmEngine().cache_evidence("other 1\n").hits_seen is None
    assert VllmEngine().cache_evidence(None).hits_seen is None
    assert LlamaCppPythonEngine().cache_evidence("x 1").hits_seen is None


def test_vllm_histogram_in_the_fake_advances_with_requests() -> None:
    read = witness.step_totals_reader("vllm:iteration_tokens_total")
    with fake_engine("vllm", parallel=1) as server:
        metrics = server.base_url + "/metrics"
        before = read(requests.get(metrics, timeout=5).text)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=5)
        after = read(requests.get(metrics, timeout=5).text)
    assert before == {"steps": 0.0, "tokens": 0.0, "steps_over_1_token": 0.0}
    assert after == {"steps": 4.0, "tokens": 4.0, "steps_over_1_token": 0.0}  # ran alone
    with fake_engine("vllm", parallel=1, histogram=False) as server:
        assert read(requests.get(server.base_url + "/metrics", timeout=5).text) is None


def test_step_totals_and_pass_deltas() -> None:
    from batch_invariance.run.dispatch import counter_deltas

    text = (
        'h_bucket{le="1.0"} 6\nh_bucket{le="8.0"} 9\nh_bucket{le="+Inf"} 10\nh_count 10\nh_sum 40\n'
    )
    totals = witness.step_totals_reader("h")(text)
    assert totals == {"steps": 10.0, "tokens": 40.0, "steps_over_1_token": pytest.approx(4.0)}
    assert witness.step_totals_reader("absent")(text) is None
    before = {"h": {"steps": 2.0, "tokens": 5.0}, "gone": {"steps": 1.0}}
    after = {"h": {"steps": 7.0, "tokens": 5.0}}
    # Only what was read both times has a delta; a counter missing at either end has none.
    assert counter_deltas(before, after) == {"h": {"steps": 5.0, "tokens": 0.0}}
    assert [c.label for c in VllmEngine().pass_counters("http://x")] == ["vllm-iteration-tokens"]
    assert all(
        engine_for(n).pass_counters("http://x") == ()
        for n in ("llama-server", "llama-cpp-python", "sglang")
    )


def test_fake_error_body_is_the_openai_shape() -> None:
    with fake_engine("vllm", parallel=1) as server:
        resp = requests.post(server.base_url + "/v1/chat/completions", data=b"{", timeout=5)
    assert resp.status_code == 400
    assert resp.json()["object"] == "error" and resp.json()["code"] == 400


def _chat_payload(
    usage: dict[str, object], timings: dict[str, float] | None = None
) -> dict[str, object]:
    body: dict[str, object] = {
        "choices": [{"message": {"content": "4"}, "finish_reason": "stop"}],
        "usage": usage,
    }
    if timings is not None:
        body["timings"] = timings
    return body


def test_openai_cached_tokens_are_cache_evidence() -> None:
    from batch_invariance.run.trials import parse_completion

    got = parse_completion(
        "x", _chat_payload({"prompt_tokens_details": {"cached_tokens": 5}}), chat=True
    )
    assert got.timings == {"cache_n": 5.0}
    assert any("cache_n != 0" in n for n in got.notes)
    # llama-server's own timings.cache_n wins where both are present.
    both = _chat_payload({"prompt_tokens_details": {"cached_tokens": 5}}, {"cache_n": 0.0})
    assert parse_completion("x", both, chat=True).timings == {"cache_n": 0.0}
    assert parse_completion("x", _chat_payload({}), chat=True).timings == {}


def test_what_differs_between_engines_is_a_property_of_each_adapter(tmp_path: Path) -> None:
    llama, vllm = engine_for("llama-server"), engine_for("vllm")
    lcp = engine_for("llama-cpp-python")
    assert llama.kv_layouts == {"split", "unified"} and vllm.kv_layouts == {"split"}
    assert llama.reports_slots and not vllm.reports_slots and not lcp.reports_slots
    assert llama.takes_profiles and not vllm.takes_profiles
    real = tmp_path / "bin" / "real"
    real.parent.mkdir()
    real.write_text("")
    link = tmp_path / "python"
    link.symlink_to(real)
    assert llama.resolve_binary(link) == real.resolve()  # the cert names the file that ran
    assert vllm.resolve_binary(link) == link.absolute()  # a venv's interpreter stays as given
    assert llama.kv_label(512, 4, "unified").startswith("unified:-c 2048 -np 4 -kvu")
    assert lcp.kv_label(512, 4, "split") == (
        "llama-cpp-python:one-context:512 (serves one request at a time)"
    )
    assert vllm.kv_label(512, 4, "split") == "vllm:4 seqs x 512 tokens"
    assert llama.guard_flags(["-ctk", "q8_0"]) == ("-ctk", "q8_0")
    assert vllm.guard_flags(["-ctk", "q8_0"]) == ()
    unified = llama.launch_command(
        LaunchRequest(Path("ls"), M, 4, 512, "127.0.0.1", 9, kv_layout="unified")
    )
    assert "--kv-unified" in unified.argv and "--no-kv-unified" not in unified.argv


def test_flags_an_engine_would_refuse_to_start_with_are_conflicts() -> None:
    (problem,) = flag_conflicts(engine_for("llama-server"), ["--not-an-option"])
    assert problem == "--not-an-option: llama-server has no such option (write --name value)"
    assert flag_conflicts(engine_for("vllm"), ["--not-an-option"]) == ()
