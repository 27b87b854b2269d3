"""The one launcher sizes vLLM's ``--gpu-memory-utilization`` from weights + KV for N x ctx +
runtime, passes it on every launch, checks a user's value, and refuses before launching where
the server could not start; the prompt-cache arm's llama-server counts its ``--cache-ram``."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance.engines.base import PromptCache
from batch_invariance.engines.llama_server.engine import LlamaServerEngine
from batch_invariance.engines.vllm import RUNTIME_BYTES, VllmEngine
from batch_invariance.errors import GuardRefused, UsageError
from batch_invariance.host.gguf import parse_info
from batch_invariance.host.hf_model import read_hf_model
from batch_invariance.host.memory import GIB, HostMemory
from batch_invariance.host.node_memory import NodeMemory
from batch_invariance.servers import ports
from batch_invariance.servers.launch import EngineLauncher
from tests.support.fakes_live import dense_meta, fake_server, hf_model_files, write_gguf

VLLM = VllmEngine()
ROOMY = NodeMemory(0, 16 * GIB, 12 * GIB)


def host_with(node: NodeMemory | None = ROOMY) -> HostMemory:
    return HostMemory(20 * GIB, 32 * GIB, None, node)


def vllm_launcher(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> EngineLauncher:
    model = hf_model_files(tmp_path / "model").parent
    return EngineLauncher(
        VLLM, tmp_path / "python", model, tmp_path / "out",
        port_policy=ports.make_policy(None, None), server_flags=flags,
        hf_model=read_hf_model(model), reservation=VLLM.memory_reservation(flags, env or {}),
    )  # fmt: skip


def _argv_fraction(argv: tuple[str, ...]) -> str:
    return argv[argv.index("--gpu-memory-utilization") + 1]


def test_the_sized_fraction_reaches_every_vllm_argv_and_holds_weights_kv_and_runtime(
    tmp_path: Path,
) -> None:
    launcher = vllm_launcher(tmp_path)
    for arm, n in (("A", 1), ("BC", 4), ("cache", 4)):
        decision = launcher.guard_decision(n, 2048, host_with(), arm)
        assert decision is not None and decision.refusal is None
        fraction = decision.reservation
        assert fraction is not None and not fraction.given
        kv = 36864 * 2048 * n
        assert decision.projection.total_bytes == len(b"weights") + kv + RUNTIME_BYTES
        assert fraction.reserved_bytes >= decision.projection.total_bytes
        argv = launcher.planned(n, 2048, 0, arm, decision).command.argv
        assert _argv_fraction(argv) == f"{fraction.fraction:g}"


def test_the_guard_goes_red_when_the_node_has_too_little_free_and_green_with_enough(
    tmp_path: Path,
) -> None:
    launcher = vllm_launcher(tmp_path)
    tight = launcher.guard_decision(4, 2048, host_with(NodeMemory(0, 16 * GIB, 2 * GIB)))
    assert tight is not None and tight.refusal is not None
    assert "exit at start" in tight.refusal and "free memory" in tight.refusal
    roomy = launcher.guard_decision(4, 2048, host_with())
    assert roomy is not None and roomy.refusal is None


def test_a_users_fraction_wins_is_not_added_again_and_is_checked(tmp_path: Path) -> None:
    ok = vllm_launcher(tmp_path / "ok", "--gpu-memory-utilization", "0.5")
    decision = ok.guard_decision(4, 2048, host_with())
    assert decision is not None and decision.refusal is None
    argv = ok.planned(4, 2048, 0, "BC", decision).command.argv
    assert argv.count("--gpu-memory-utilization") == 1 and _argv_fraction(argv) == "0.5"

    small = vllm_launcher(tmp_path / "small", "--gpu-memory-utilization=0.05")
    refused = small.guard_decision(4, 2048, host_with())
    assert refused is not None and refused.refusal is not None
    assert "less than the cell needs" in refused.refusal and "drop the flag" in refused.refusal

    large = vllm_launcher(tmp_path / "large", "--gpu_memory_utilization", "0.92")
    refused = large.guard_decision(4, 2048, host_with())
    assert refused is not None and refused.refusal is not None
    assert "lower --gpu-memory-utilization to at most 0.75" in refused.refusal


def test_a_launch_the_guard_refuses_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "never"
    launcher = vllm_launcher(tmp_path, "--gpu-memory-utilization", "0.01")
    launcher.server_bin = marker
    with (
        pytest.raises(GuardRefused, match="less than the cell needs"),
        launcher.launch("BC", 4, 2048),
    ):
        pass
    assert launcher.launches == [] and not marker.exists()


def test_an_explicit_kv_size_is_checked_and_no_fraction_is_passed(tmp_path: Path) -> None:
    launcher = vllm_launcher(tmp_path / "env", env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    decision = launcher.guard_decision(4, 2048, host_with())
    assert decision is not None and decision.refusal is None and decision.reservation is None
    assert (
        "--gpu-memory-utilization" not in launcher.planned(4, 2048, 0, "BC", decision).command.argv
    )
    small = vllm_launcher(tmp_path / "flag", "--kv-cache-memory-bytes", "64M")
    refused = small.guard_decision(4, 2048, host_with())
    assert refused is not None and refused.refusal is not None
    assert "--kv-cache-memory-bytes gives the KV cache 0.06 GiB" in refused.refusal


def test_an_unreadable_node_fails_closed(tmp_path: Path) -> None:
    decision = vllm_launcher(tmp_path).guard_decision(1, 512, host_with(node=None))
    assert decision is not None and decision.refusal is not None
    assert "cannot be sized or checked" in decision.refusal


@pytest.mark.parametrize("value", ["0", "1.5", "half"])
def test_a_malformed_fraction_is_a_usage_error(value: str) -> None:
    with pytest.raises(UsageError, match="fraction in \\(0, 1\\]"):
        VLLM.memory_reservation(("--gpu-memory-utilization", value), {})


def test_the_prompt_cache_server_counts_llama_servers_cache_ram(tmp_path: Path) -> None:
    model = write_gguf(tmp_path / "tiny.gguf", dense_meta())

    def launcher(cache: PromptCache) -> EngineLauncher:
        return EngineLauncher(
            LlamaServerEngine(), fake_server(tmp_path / "bin"), model, tmp_path / "out",
            port_policy=ports.make_policy(None, None), gguf=parse_info(model),
            prompt_cache=cache,
        )  # fmt: skip

    default = launcher(PromptCache())
    bc = default.guard_decision(4, 512, host_with(), "BC")
    cache = default.guard_decision(4, 512, host_with(), "cache")
    assert bc is not None and cache is not None
    # llama-server's own default --cache-ram is 8192 MiB (its --help).
    assert cache.projection.total_bytes - bc.projection.total_bytes == 8192 * 1024**2
    small = launcher(PromptCache(256)).guard_decision(4, 512, host_with(), "cache")
    assert small is not None and small.projection.cache_bytes == 256 * 1024**2
    unbounded = launcher(PromptCache(-1)).guard_decision(4, 512, host_with(), "cache")
    assert unbounded is not None and unbounded.projection.cache_unbounded
    tight = HostMemory(4 * GIB, 32 * GIB, None, ROOMY)
    refused = default.guard_decision(4, 512, tight, "cache")
    assert refused is not None and refused.refusal is not None
    assert "or --cache-ram" in refused.refusal
    assert default.guard_decision(4, 512, tight, "BC").refusal is None  # type: ignore[union-attr]
