"""check-deploy fails closed on each way a deploy could run what the cert never measured (one
reproducer per class, through the CLI, against the world's GREEN: ctx 1024, N 4, split, -ub 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance import exitcodes
from tests.support.deploy_world import MODEL, OK_FLAGS, TOOL, Capsys, World, _unsigned, gate, served
from tests.support.deploy_world import assert_covered_raw as raw
from tests.support.golden import check_golden

NEUTRAL = "--host 0.0.0.0 --port 8080 --api-key team#42 --metrics --timeout 30"


def test_the_measured_deploy_passes_plain_and_with_neutral_options(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    m = world["model"]
    snake = f"--model {m} --ctx_size 4096 --parallel 4 --ubatch_size 1 --no-cache-prompt "
    padded = f"-m {m} -c 4000 -np 4 -ub 1 --no-cache-prompt --cache-ram 0"  # pads to 1024 a slot
    for flags in (f"-m {m} {OK_FLAGS}", f"-m {m} {OK_FLAGS} {NEUTRAL}", snake + "--cache_ram 0",
                  padded):  # fmt: skip
        engine = f"llama-server {flags}"
        raw(_unsigned(world, tmp_path, f"{engine}\n"), capsys.readouterr().out)
        assert _unsigned(world, tmp_path, f"exec {served(engine, world['certs'])}\n") == 0
        assert "check-deploy: PASS" in capsys.readouterr().out


NO, USAGE = exitcodes.NOT_PROMOTABLE, exitcodes.USAGE


@pytest.mark.parametrize(
    ("line", "named", "code"),
    [
        ("--kv_unified", "KV layout unified (measured split)", NO),
        ("--ubatch_size 512", "--ubatch-size 512 (measured 1)", NO),
        ("--cache_ram 8192", "caches prompts (--cache-ram 8192) but the cert measured", NO),
        ("--cache_type_k q4_0", "--cache-type-k q4_0 (measured f16)", NO),
        ("--no_cont_batching", "--cont-batching off (measured on)", NO),
        ("--n_cpu_moe 2", "--n-cpu-moe 2 (measured unset)", NO),
        ("--ubatch-size=512", "llama-server rejects --ubatch-size=512", NO),
        ("--tags chat", "option --tags is in no class", NO),
        ("-fa on", "--flash-attn on (measured auto)", NO),
        ("-ngl 99", "--gpu-layers 99 (measured auto)", NO),
        ("-md /srv/draft.gguf --spec-draft-n-max 8",
         "--spec-draft-model /srv/draft.gguf (measured unset)", NO),
        ("--lora /srv/a.gguf", "--lora /srv/a.gguf (measured unset)", NO),
        ("-bs", "--backend-sampling on (measured off)", NO),
        ("-c 4097", f"{MODEL} ctx=1280 N=4", NO),  # padded as llama.cpp pads it
        ("export LLAMA_ARG_NO_KV_OFFLOAD=0", "--kv-offload off (measured on)", NO),
        ("export GGML_CUDA_DISABLE_FUSION=1", "environment GGML_CUDA_DISABLE_FUSION=1", NO),
        ("export LD_PRELOAD=/opt/x.so", "environment LD_PRELOAD=/opt/x.so", NO),
        ("export LLAMA_ARG_KV_UNIFIED=True", "LLAMA_ARG_KV_UNIFIED needs on/off", USAGE),
    ],
)  # fmt: skip
def test_what_the_server_reads_otherwise_than_measured_is_not_covered(
    world: World, tmp_path: Path, capsys: Capsys, line: str, named: str, code: int
) -> None:
    """Options (any spelling llama-server reads) and the environment the server reads."""
    engine = f"llama-server -m {world['model']} {OK_FLAGS}"
    env, flags = (line, "") if line.startswith("export ") else ("", line)
    assert _unsigned(world, tmp_path, f"{env}\n{engine} {flags}\n".lstrip()) == code
    text = "".join(capsys.readouterr())
    assert "check-deploy: PASS" not in text and named in text, text


def test_check_deploy_output_is_golden(world: World, tmp_path: Path, capsys: Capsys) -> None:
    """A deploy outside the grammar (the line, the construct, the fix), the ordinary shape started
    directly (covered, never a pass: the serve line to write) and through serve (a pass)."""
    m = world["model"]
    outside = "set -e\necho starting >> /var/log/llm.log\ncurl -o /tmp/m.gguf https://x.org/m\n"
    engine = f"llama-server -m {m} {OK_FLAGS} -n 64 --host 0.0.0.0 --port 8080"
    ordinary = "#!/bin/bash\nset -euo pipefail\nulimit -n 65536\n" \
        "echo starting >> /var/log/llm.log\nexec {}\necho never\n"  # fmt: skip
    out = []
    bodies = (f"{outside}exec llama-server -m {m} {OK_FLAGS}\n", ordinary.format(engine),
              ordinary.format(served(engine, world["certs"])))  # fmt: skip
    for body, code in zip(bodies, (NO, NO, exitcodes.PROMOTABLE), strict=True):
        assert _unsigned(world, tmp_path, body) == code
        out.append(capsys.readouterr().out)
    text = "".join(out).replace(str(tmp_path), "<tmp>").replace(str(world["root"]), "<root>")
    check_golden("check_deploy.txt", text.replace(str(TOOL), "<tool>"))


def test_the_measured_deploy_passes_as_a_unit_with_a_drop_in(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    unit = tmp_path / "llm.service"
    unit.write_text(
        "[Unit]\nDescription=llama-server\n[Service]\nNice=5\nLimitNOFILE=65536\n"
        f"ExecStart={world['binary']} -m {world['model']} -c 8192 -np 8\n"
        "Restart=on-failure\n[Install]\nWantedBy=multi-user.target\n"
    )
    (tmp_path / "llm.service.d").mkdir()
    engine = f"{world['binary']} -m {world['model']} {OK_FLAGS} {NEUTRAL.replace('#', '-')}"
    drop_in = tmp_path / "llm.service.d" / "10-measured.conf"
    drop_in.write_text(f"[Service]\nExecStart=\nExecStart={engine}\n")
    code, out = gate(unit, world["certs"]), capsys.readouterr().out
    raw(code, out)
    assert "10-measured.conf:3]" in out  # the ExecStart= that runs is named
    drop_in.write_text(f"[Service]\nExecStart=\nExecStart={served(engine, world['certs'])}\n")
    assert gate(unit, world["certs"]) == exitcodes.PROMOTABLE
    assert "10-measured.conf:3]  promotable cert" in capsys.readouterr().out
    drop_in.unlink()  # the unit's own ExecStart runs: N=8, not measured
    assert gate(unit, world["certs"]) == NO and "N=8" in capsys.readouterr().out
