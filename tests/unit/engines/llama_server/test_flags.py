"""The one llama-server flag reader, the owned/refused flags and the unified-KV argv."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from batch_invariance.engines.llama_server.engine import build_argv, kv_label
from batch_invariance.engines.llama_server.flags import (
    OWNED_FLAGS,
    REFUSED_FLAGS,
    FlagError,
    PaddedContext,
    flag_conflicts,
    numerics_differences,
    padded_context,
    read_flags,
    slot_layout,
)


def test_command_line_beats_environment_and_later_beats_earlier() -> None:
    flags = read_flags(
        ["llama-server", "-c", "1", "--ctx-size", "2048", "-ctk", "q8_0"],
        {"LLAMA_ARG_CTX_SIZE": "99", "LLAMA_ARG_N_PARALLEL": "3", "LLAMA_ARG_CACHE_TYPE_V": "q4_0"},
    )
    assert (flags.ctx_size, flags.parallel, flags.cache_types) == (2048, 3, ("q8_0", "q4_0"))
    assert read_flags(["--lora", "a", "--lora", "b"]).occurrences["--lora"] == ("a", "b")
    assert read_flags(["-kvu", "--no-kv-unified"]).kv_unified is False
    assert read_flags([], {"LLAMA_ARG_KV_UNIFIED": "true"}).kv_unified is True
    with pytest.raises(FlagError, match="-np needs an integer"):
        read_flags(["-np", "four"])
    with pytest.raises(FlagError, match="needs on/off"):
        read_flags([], {"LLAMA_ARG_KV_UNIFIED": "maybe"})


def test_snake_case_and_equals_forms_are_read_as_llama_server_reads_them() -> None:
    # llama-server rewrites every _ of a --word to -: each of these is the option itself.
    flags = read_flags(
        ["--kv_unified", "--ctx_size", "65536", "--cache_ram", "8192", "--ubatch_size", "512",
         "--cache_type_k", "q4_0", "--n_predict", "64", "--no_cont_batching"]
    )  # fmt: skip
    assert (flags.kv_unified, flags.ctx_size, flags.n_predict) == (True, 65536, 64)
    assert flags.values["--cont-batching"] == "off" and flags.cache_type_k == "q4_0"
    assert flags.rejected == ()
    # It has no --x=y form: the word is an invalid argument (the server refuses to start).
    assert read_flags(["--ctx-size=2048", "-c", "512"]).rejected == ("--ctx-size=2048",)
    assert read_flags(["-m", "a.gguf", "stray"]).rejected == ("stray",)
    # Short spellings are not rewritten.
    assert read_flags(["-ct_k", "q8_0"]).rejected == ("-ct_k", "q8_0")


def test_environment_follows_the_server_rules() -> None:
    # LLAMA_ARG_NO_X set to anything is "off", whatever LLAMA_ARG_X says.
    env = {"LLAMA_ARG_NO_KV_UNIFIED": "", "LLAMA_ARG_KV_UNIFIED": "1"}
    assert read_flags(["-np", "4"], env).kv_unified is False
    # Switch values are case-sensitive: "True" is refused by the server.
    with pytest.raises(FlagError, match="needs on/off"):
        read_flags([], {"LLAMA_ARG_KV_UNIFIED": "True"})
    # A switch without an off spelling ignores a value that is not truthy.
    assert "--metrics" not in read_flags([], {"LLAMA_ARG_ENDPOINT_METRICS": "no"}).values
    assert read_flags([], {"LLAMA_ARG_ENDPOINT_METRICS": "1"}).values["--metrics"] == "on"


def test_slot_layout_follows_the_server() -> None:
    assert slot_layout(read_flags([])).__dict__ == {"parallel": 4, "kv_unified": True, "auto": True}
    assert slot_layout(read_flags(["-np", "-1", "-no-kvu"])).kv_unified is True
    assert slot_layout(read_flags(["-np", "8"])).kv_unified is False
    assert slot_layout(read_flags(["-np", "8", "-kvu"])).kv_unified is True
    with pytest.raises(FlagError):
        slot_layout(read_flags(["-np", "0"]))


def test_context_is_padded_as_llama_cpp_pads_it() -> None:
    split4 = slot_layout(read_flags(["-np", "4"]))
    assert padded_context(4096, split4) == PaddedContext(pool=4096, per_slot=1024)
    # -c 4097 -np 4: the pool pads to 4352, a slot's 1088 pads to 1280.
    assert padded_context(4097, split4) == PaddedContext(pool=5120, per_slot=1280)
    assert padded_context(4000, split4).per_slot == 1024
    unified = slot_layout(read_flags(["-np", "4", "-kvu"]))
    assert padded_context(4000, unified) == PaddedContext(pool=4096, per_slot=1024)


def test_flash_attention_and_compared_defaults() -> None:
    assert read_flags(["-fa", "1"]).values["--flash-attn"] == "on"
    assert read_flags(["-fa", "auto"]).values["--flash-attn"] == "auto"
    with pytest.raises(FlagError, match="needs on/off"):
        read_flags(["-fa", "ON"])
    same = numerics_differences(read_flags(["-fa", "auto", "-b", "2048"]), read_flags([]))
    assert same == ()
    assert numerics_differences(read_flags(["-nkvo"]), read_flags([])) == (
        "--kv-offload off (measured on)",
    )
    spec = numerics_differences(read_flags(["--spec-draft-n-max", "8"]), read_flags([]))
    assert spec == ("--spec-draft-n-max 8 (measured unset)",)
    moe = numerics_differences(read_flags(["--n-cpu-moe", "4"]), read_flags([]))
    assert moe == ("--n-cpu-moe 4 (measured unset)",)
    # Neutral options are not compared; unclassified ones are named.
    assert numerics_differences(read_flags(["--port", "1", "--api-key", "k"]), read_flags([])) == ()
    assert read_flags(["--tags", "a"]).unclassified() == ("--tags",)


def test_cache_types_and_gpu_offload_come_from_the_same_reader() -> None:
    from batch_invariance.host import memory

    assert memory.cache_types(["-ctk", "q8_0", "--cache_type_v", "q4_0"]) == ("q8_0", "q4_0")
    assert memory.offloads_to_gpu(["--n-gpu-layers", "all"]) is True
    assert memory.offloads_to_gpu(["-ngl", "0"]) is False


def test_the_driver_owns_or_refuses_every_flag_that_changes_what_is_measured() -> None:
    for flag in ("-np", "--parallel", "-c", "--ctx-size", "-kvu", "--kv-unified", "--cache-ram"):
        assert flag in OWNED_FLAGS
    for flag in ("-hf", "--hf-repo", "-mu", "--no-slots", "-nocb", "--cache-reuse", "-n"):
        assert flag in REFUSED_FLAGS
    user = ["-ngl", "99", "-hf", "x/y", "--cache-reuse=256", "--cache-ram", "0", "-ub", "1"]
    assert flag_conflicts(user) == ("-hf", "--cache-reuse=256", "--cache-ram")
    snake = ["--kv_unified", "--ctx_size", "1", "--cache_ram", "0", "--n_predict", "8",
             "--no_cont_batching", "-ub", "1"]  # fmt: skip
    assert flag_conflicts(snake) == (
        "--kv_unified",
        "--ctx_size",
        "--cache_ram",
        "--n_predict",
        "--no_cont_batching",
    )
    assert flag_conflicts(["-nocb", "--metrics"]) == ("-nocb",)
    assert flag_conflicts(["-ngl", "99", "--port=1", "-c"]) == ("--port=1", "-c")
    parsed = read_flags(["--no-slots", "-ub", "1"], {"LLAMA_ARG_N_PARALLEL": "2"})
    assert flag_conflicts(parsed) == ("--no-slots",)


@pytest.mark.parametrize(
    "flag",
    [
        "-hf=o/m",
        "--cache-reuse=256",
        "--cache-ram=0",
        "-nocb",
        "-mu=x",
        "--kv_unified",
        "--ctx_size",
        "--cache_ram",
        "--ubatch-size=512",
        "--no_cont_batching",
        "--n_predict",
    ],
)
def test_run_live_refuses_them_as_a_usage_error_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\nexit 1\n")
    server.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    workset = tmp_path / "w.json"
    workset.write_text('[{"id": "a", "prompt": "hi"}]')
    code = main(
        ["run-live", "--server-bin", str(server), "--model", str(model), "--workset",
         str(workset), "--ctx", "256", "--parallel", "2", "--out-dir", str(tmp_path / "o"),
         f"--server-flag={flag}"]
    )  # fmt: skip
    assert code == exitcodes.USAGE
    assert flag in capsys.readouterr().err


def test_unified_layout_is_one_pool_of_ctx_times_n() -> None:
    argv = build_argv(Path("s"), Path("m"), host="h", port=1, parallel=4, ctx=512,
                      kv_layout="unified")  # fmt: skip
    flags = read_flags(argv, first_is_binary=True)
    assert (flags.ctx_size, flags.parallel, flags.kv_unified) == (2048, 4, True)
    assert kv_label(512, 4, "unified").startswith("unified:-c 2048 -np 4 -kvu")
    split = read_flags(build_argv(Path("s"), Path("m"), host="h", port=1, parallel=4, ctx=512))
    assert (split.ctx_size, split.kv_unified, split.values["--cache-ram"]) == (2048, False, "0")
    assert kv_label(512, 4).startswith("split:")


def test_run_live_dry_run_shows_the_unified_bc_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = Path.home() / ".cache/batch-invariance/models/gemma-3-270m-q4_k_m.gguf"
    if not model.is_file():
        pytest.skip("the provisioned model is not here")
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\nexit 1\n")
    server.chmod(0o755)
    workset = tmp_path / "w.json"
    workset.write_text('[{"id": "a", "prompt": "hi"}]')
    code = main(
        ["run-live", "--dry-run", "--server-bin", str(server), "--model", str(model),
         "--workset", str(workset), "--ctx", "256", "--parallel", "4", "--out-dir",
         str(tmp_path / "o"), "--kv-layout", "unified"]
    )  # fmt: skip
    printed = capsys.readouterr()
    out = printed.out
    # One prompt can never reach GREEN: the plan is printed whole, then refused (exit 2).
    assert code == 2 and "cannot reach GREEN: too few distinct prompts" in printed.err, out
    bc = next(line for line in out.splitlines() if line.startswith("server BC:"))
    assert "--ctx-size 1024 --kv-unified" in bc and "kv: unified:-c 1024 -np 4 -kvu" in out
    a = next(line for line in out.splitlines() if line.startswith("server A:"))
    assert "--no-kv-unified" in a


def test_measured_servers_get_no_llama_arg_variables_and_no_user_config() -> None:
    from batch_invariance.engines.llama_server.env import config_files, engine_env, measured_env

    env = measured_env(
        {"PATH": "/bin", "LLAMA_ARG_UBATCH": "512", "LLAMA_ARG_N_PARALLEL": "8",
         "LLAMA_API_KEY": "k", "XDG_CONFIG_HOME": "/home/u/.config", "GGML_CUDA_NO_PINNED": "1"}
    )  # fmt: skip
    assert env == {"PATH": "/bin", "XDG_CONFIG_HOME": "/dev/null", "GGML_CUDA_NO_PINNED": "1"}
    # Nothing can exist under /dev/null: the server reads only the system-wide file.
    assert config_files(env, "/home/u") == (
        "/etc/llama.cpp/config.ini",
        "/dev/null/llama.cpp/config.ini",
    )
    # What ggml reads is passed on and recorded, not hidden.
    assert engine_env(env) == {"GGML_CUDA_NO_PINNED": "1"}


def test_the_committed_option_table_is_what_the_generator_writes() -> None:
    # The table is a generated module (imported, never read as a file at import): the text
    # the regenerating command would write for the same options is the committed text.
    from pathlib import Path

    from batch_invariance.engines.llama_server import option_table
    from batch_invariance.engines.llama_server.options import OPTIONS, TABLE_BUILD, table_module

    committed = Path(option_table.__file__).read_text(encoding="utf-8")
    assert table_module(OPTIONS, TABLE_BUILD) == committed
    assert len(OPTIONS) == len(option_table.ROWS) > 200
