"""Reading deploy files (pure parts and small files): which servers run, with which cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance.deploy.cells import cell_of, load_deploy_cells
from batch_invariance.deploy.config import ServerCommand, compose_commands, text_commands
from batch_invariance.errors import UsageError

MODEL = "gemma-3-270m-q4_k_m"


def _cells(text: str, name: str = "run.sh") -> list[tuple[str, int | None, int, str]]:
    return [
        (c.name, c.ctx, c.parallel, c.layout_name)
        for c in (cell_of(cmd) for cmd in text_commands(text, name, Path("/")))
    ]


def test_llama_server_slot_rules() -> None:
    # No -np: 4 slots sharing one unified pool; each slot's share is -c / 4.
    assert _cells(f"llama-server -m /m/{MODEL}.gguf -c 8192\n") == [(MODEL, 2048, 4, "unified")]
    # -np -1 is auto too, and auto forces unified even over -no-kvu (server.cpp).
    assert _cells("llama-server -m a.gguf -c 8192 -np -1 -no-kvu\n") == [("a", 2048, 4, "unified")]
    assert _cells("llama-server -m a.gguf -c 8192 -np 4\n") == [("a", 2048, 4, "split")]
    assert _cells("llama-server -m a.gguf --ctx-size=8192 --parallel=4 -kvu\n") == [
        ("a", 2048, 4, "unified")
    ]
    assert _cells("llama-server -m a.gguf -c 1 -c 64 -np 2\n") == [("a", 32, 2, "split")]
    # ctx 0 = the model's training context: unknown without the file.
    assert _cells("llama-server -m /nowhere/a.gguf -np 2\n") == [("a", None, 2, "split")]


def test_environment_anywhere_in_the_file_sets_the_cell() -> None:
    # Reproducer: N set by an export on another line passed as N 4.
    text = f"export LLAMA_ARG_N_PARALLEL=8\nllama-server -m /m/{MODEL}.gguf -c 8192 -kvu\n"
    assert _cells(text) == [(MODEL, 1024, 8, "unified")]
    # Later in the file counts too; a flag on the command line beats the variable.
    text = "llama-server -m a.gguf -c 4096 -np 2\nexport LLAMA_ARG_N_PARALLEL=8 X=1\n"
    assert _cells(text) == [("a", 2048, 2, "split")]
    text = "LLAMA_ARG_CTX_SIZE=4096 LLAMA_ARG_N_PARALLEL=2 LLAMA_ARG_MODEL=/m/b.gguf llama-server\n"
    assert _cells(text) == [("b", 2048, 2, "split")]


def test_systemd_unit_environment_and_execstart() -> None:
    unit = (
        "[Unit]\nDescription=llama-server for the chat app\n\n[Service]\n"
        'Environment=LLAMA_ARG_N_PARALLEL=16 "LLAMA_ARG_CACHE_TYPE_K=q8_0"\n'
        f"ExecStart=/usr/bin/llama-server -m /srv/{MODEL}.gguf -c 16384\n"
        "ExecStartPost=/bin/echo llama-server started\n[Install]\nWantedBy=multi-user.target\n"
    )
    cmds = text_commands(unit, "llm.service", Path("/"))
    assert [c.origin for c in cmds] == ["llm.service:6"]
    cell = cell_of(cmds[0])
    assert (cell.parallel, cell.ctx, cell.layout_name) == (16, 1024, "split")
    assert cell.flags.cache_types == ("q8_0", "f16")


def test_lines_that_only_look_like_servers_are_not_cells() -> None:
    text = (
        "python3 -m venv .venv\nDescription=llama-server\necho llama-server -m x.gguf\n"
        "systemctl restart llama-server\npkill llama-server\n# llama-server -m a.gguf\n"
        "nohup taskset -c 0-3 /opt/llama-server -m /srv/a.gguf -c 2048 -np 2 & echo ok\n"
    )
    assert _cells(text) == [("a", 1024, 2, "split")]


def test_compose_environment_map_and_list_command_string_and_list(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    data = {
        "services": {
            "web": {"image": "nginx", "command": "-m /x.gguf"},
            "llm": {
                "image": "ghcr.io/ggml-org/llama.cpp:server",
                "command": f"-m /models/{MODEL}.gguf -c 4096",
                "environment": {"LLAMA_ARG_N_PARALLEL": 4, "LLAMA_ARG_KV_UNIFIED": False},
                "volumes": ["./models:/models:ro"],
            },
            "llm2": {
                "image": "local/custom",
                "entrypoint": ["/app/llama-server"],
                "command": ["-m", "/srv/b.gguf", "-c", "2048"],
                "environment": ["LLAMA_ARG_N_PARALLEL=2", "LLAMA_ARG_UBATCH=1"],
            },
        }
    }
    cmds = compose_commands(data, "compose.yml", tmp_path)
    assert [c.origin for c in cmds] == ["compose.yml [llm]", "compose.yml [llm2]"]
    first, second = (cell_of(c) for c in cmds)
    assert (first.parallel, first.ctx, first.layout_name) == (4, 1024, "split")
    assert first.model_path == tmp_path / "models" / f"{MODEL}.gguf"
    assert (second.name, second.parallel, second.ctx) == ("b", 2, 1024)
    assert second.flags.numerics()["-ub"] == "1"


def test_compose_file_is_read_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text(
        "services:\n  llm:\n    image: ghcr.io/ggml-org/llama.cpp:server-cuda\n"
        '    command: ["-m", "/m/a.gguf", "-c", "2048", "-np", "2"]\n'
    )
    assert [(c.name, c.ctx, c.parallel) for c in load_deploy_cells(path)] == [("a", 1024, 2)]


def test_models_toml_uses_the_one_registry_reader(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[defaults]\nserver_flags = ["-c", "8192"]\n\n'
        '[[models]]\nalias = "small"\ngguf = "{MODELS_DIR}/small.gguf"\nkv = "q8_0"\n'
        'server_flags = ["-np", "2"]\n'
    )
    (cell,) = load_deploy_cells(path, "/srv")
    assert (cell.alias, cell.model, cell.ctx, cell.parallel) == (
        "small",
        "/srv/small.gguf",
        4096,
        2,
    )
    assert cell.flags.cache_types == ("q8_0", "q8_0")
    with pytest.raises(UsageError, match="no models folder was given"):
        load_deploy_cells(path, None)  # the registry's own rule, not a second reader's


def test_bad_values_and_empty_files_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"deploy.sh:1: -np needs an integer"):
        cell_of(ServerCommand("deploy.sh:1", ("llama-server", "-m", "a.gguf", "-np", "four"), {}))
    with pytest.raises(UsageError, match="no model"):
        cell_of(ServerCommand("deploy.sh:1", ("llama-server", "-c", "4096"), {}))
    with pytest.raises(UsageError, match="missing its value"):
        cell_of(ServerCommand("x", ("llama-server", "-m", "a.gguf", "-c"), {}))
    config = tmp_path / "deploy.sh"
    config.write_text("echo nothing here\npython3 -m venv .venv\n")
    with pytest.raises(UsageError, match="no llama-server command line"):
        load_deploy_cells(config)


def test_sourced_and_environment_files_are_read_or_fail_the_cell_closed(tmp_path: Path) -> None:
    (tmp_path / "env.sh").write_text("# shared settings\nexport LLAMA_ARG_N_PARALLEL=8\n")
    script = tmp_path / "run.sh"
    script.write_text(". ./env.sh\nllama-server -m /m/a.gguf -c 8192\n")
    (cell,) = load_deploy_cells(script)
    assert (cell.parallel, cell.ctx, cell.unread_env_files) == (8, 1024, ())
    unit = tmp_path / "llm.service"
    unit.write_text(
        "[Service]\nEnvironmentFile=-/etc/nowhere/llm.env\n"
        "ExecStart=/usr/bin/llama-server -m /m/a.gguf -c 4096 -np 2\n"
    )
    (cell,) = load_deploy_cells(unit)
    assert cell.unread_env_files == ("/etc/nowhere/llm.env",)


def test_variables_are_expanded_from_the_file_environment() -> None:
    unit = (
        "[Service]\nEnvironment=NP=8 MODEL=/srv/b.gguf\n"
        "ExecStart=/usr/bin/llama-server -m ${MODEL} -c 8192 -np $NP\n"
    )
    assert _cells(unit, "llm.service") == [("b", 1024, 8, "split")]
    with pytest.raises(UsageError, match=r"-np needs an integer, got '\$UNSET'"):
        _cells("llama-server -m a.gguf -np $UNSET\n")


def test_model_identity_uses_the_strongest_check_available(tmp_path: Path) -> None:
    import hashlib

    from batch_invariance.deploy.identity import ModelIdentity, identify_model, model_differences

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF-one")
    recorded = {
        "model_file": {
            "name": "m.gguf",
            "size": 8,
            "sha256": hashlib.sha256(b"GGUF-one").hexdigest(),
        }
    }
    found = identify_model(model, str(model))
    assert found.method == "sha256" and model_differences(found, recorded) == ()
    assert model_differences(found, {"model_file": {"name": "m.gguf", "size": 8}}) == (
        "the cert records no model sha256",
    )
    # Stat-able but not readable (not reproducible as root): size and name must both agree.
    by_stat = ModelIdentity("size and name", "m.gguf", size=8)
    assert model_differences(by_stat, recorded) == ()
    assert model_differences(ModelIdentity("size and name", "m.gguf", size=9), recorded)
    # Not here, or downloaded with -hf: nothing can be checked, so nothing matches.
    assert (
        "cannot be checked"
        in model_differences(identify_model(tmp_path / "x.gguf", "x"), recorded)[0]
    )
    hub = identify_model(None, "org/repo:Q4_K_M")
    assert hub.method == "nothing" and model_differences(hub, recorded)
