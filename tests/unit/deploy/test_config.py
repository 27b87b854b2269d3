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
        for c in (cell_of(cmd) for cmd in text_commands(text, name, Path("/")).commands)
    ]


def _unmodelled(text: str, name: str = "run.sh") -> tuple[str, ...]:
    return text_commands(text, name, Path("/")).unmodelled


def test_llama_server_slot_rules() -> None:
    # No -np: 4 slots sharing one unified pool; each slot's share is -c / 4.
    assert _cells(f"llama-server -m /m/{MODEL}.gguf -c 8192\n") == [(MODEL, 2048, 4, "unified")]
    # -np -1 is auto too, and auto forces unified even over -no-kvu (server.cpp).
    assert _cells("llama-server -m a.gguf -c 8192 -np -1 -no-kvu\n") == [("a", 2048, 4, "unified")]
    assert _cells("llama-server -m a.gguf -c 8192 -np 4\n") == [("a", 2048, 4, "split")]
    assert _cells("llama-server -m a.gguf --ctx_size 8192 --parallel 4 -kvu\n") == [
        ("a", 2048, 4, "unified")
    ]
    # The last -c counts, padded as llama.cpp pads it (a slot never gets under 256).
    assert _cells("llama-server -m a.gguf -c 1 -c 64 -np 2\n") == [("a", 256, 2, "split")]
    assert _cells("llama-server -m a.gguf -c 4097 -np 4\n") == [("a", 1280, 4, "split")]
    # ctx 0 = the model's training context: unknown without the file.
    assert _cells("llama-server -m /nowhere/a.gguf -np 2\n") == [("a", None, 2, "split")]


def test_assignments_apply_in_order_and_only_exported_ones_reach_the_server() -> None:
    text = f"export LLAMA_ARG_N_PARALLEL=8\nllama-server -m /m/{MODEL}.gguf -c 8192 -kvu\n"
    assert _cells(text) == [(MODEL, 1024, 8, "unified")]
    # A later export does not reach an earlier server; a flag beats the variable.
    text = "llama-server -m a.gguf -c 4096 -np 2\nexport LLAMA_ARG_N_PARALLEL=8 X=1\n"
    assert _cells(text) == [("a", 2048, 2, "split")]
    text = "LLAMA_ARG_CTX_SIZE=4096 LLAMA_ARG_N_PARALLEL=2 LLAMA_ARG_MODEL=/m/b.gguf llama-server\n"
    assert _cells(text) == [("b", 2048, 2, "split")]
    # Reproducer: NP=8 before one server and NP=4 before another were both read as 4.
    text = (
        "NP=8\nllama-server -m /m/a.gguf -c 8192 -np $NP\n"
        "NP=4\nllama-server -m /m/b.gguf -c 4096 -np $NP\n"
    )
    assert _cells(text) == [("a", 1024, 8, "split"), ("b", 1024, 4, "split")]
    # A shell variable that is not exported does not reach the server.
    assert _cells("LLAMA_ARG_N_PARALLEL=8\nllama-server -m /m/a.gguf -c 8192\n") == [
        ("a", 2048, 4, "unified")
    ]
    # set -a exports every later assignment.
    assert _cells("set -a\nLLAMA_ARG_N_PARALLEL=8\nllama-server -m /m/a.gguf -c 8192\n") == [
        ("a", 1024, 8, "split")
    ]


def test_prefix_assignments_expand_before_they_apply() -> None:
    assert _cells("N=4\nN=1 llama-server -m /m/a.gguf -c 4096 -np $N\n") == [
        ("a", 1024, 4, "split")
    ]


def test_sudo_and_env_i_reset_the_environment() -> None:
    text = (
        "export LLAMA_ARG_N_PARALLEL=8\nsudo -u llm llama-server -m /m/a.gguf -c 8192\n"
        "env -i LLAMA_ARG_CTX_SIZE=4096 llama-server -m /m/a.gguf -np 2\n"
        "env -u LLAMA_ARG_N_PARALLEL llama-server -m /m/a.gguf -c 8192\n"
        "llama-server -m /m/a.gguf -c 8192\n"
    )
    assert _cells(text) == [
        ("a", 2048, 4, "unified"), ("a", 2048, 2, "split"), ("a", 2048, 4, "unified"),
        ("a", 1024, 8, "split"),
    ]  # fmt: skip
    assert "sudo keeps the caller" in _unmodelled("sudo -E llama-server -m /m/a.gguf\n")[0]


def test_cd_before_a_relative_model_path() -> None:
    cmds = text_commands(
        "cd /srv/models\nllama-server -m a.gguf -c 4096 -np 2\n", "r.sh", Path("/x")
    )
    assert cell_of(cmds.commands[0]).model_path == Path("/srv/models/a.gguf")
    lost = text_commands('cd "$DIR"\nllama-server -m a.gguf -c 4096 -np 2\n', "r.sh", Path("/x"))
    (cell,) = (cell_of(c) for c in lost.commands)
    assert cell.model_path is None and "could not follow" in cell.not_covered[0]


def test_hash_inside_a_word_and_a_comment_ending_in_a_backslash() -> None:
    # Reproducer: "team#42" was read as a comment, hiding -c 65536 -np 16.
    assert _cells("llama-server -m /m/a.gguf --api-key team#42 -c 65536 -np 16\n") == [
        ("a", 4096, 16, "split")
    ]
    # A comment ending in \ continues nothing: the next line is a command.
    assert _cells("# start it \\\nllama-server -m /m/a.gguf -c 4096 -np 2\n") == [
        ("a", 2048, 2, "split")
    ]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("for n in 2 4; do\n  llama-server -m /m/a.gguf -np $n\ndone\n", "inside for"),
        ("if true; then llama-server -m /m/a.gguf -np 8; fi\n", "inside if"),
        ("( llama-server -m /m/a.gguf -np 8 )\n", "inside ("),
        ("start() {\n  llama-server -m /m/a.gguf -np 8\n}\nstart\n", "inside {"),
        ("bash -c 'llama-server -m /m/a.gguf -np 8'\n", "bash runs something"),
        ("$BIN -m /m/a.gguf -np 8\n", "a variable as the command word"),
        ("BIN=/opt/llama-server\n$BIN -np 8 -m x\n", "a variable as the command word"),
        ("docker run ghcr.io/ggml-org/llama.cpp:server -m /m/a.gguf\n", "docker runs"),
        ("podman run --rm \\\n  ghcr.io/ggml-org/llama.cpp:server\n", "podman runs"),
        ("llama-server -m $(ls /m/*.gguf) -np 8\n", "command substitution"),
        ("llama-server -m /m/a.gguf -np $UNSET\n", "$UNSET is not set in this file"),
        ("cat > run.sh <<EOF\nllama-server -m /m/a.gguf -np 8\nEOF\n", "here-document"),
        ("export -n LLAMA_ARG_N_PARALLEL\n", "export -n"),
    ],
)
def test_what_is_not_modelled_fails_closed_naming_the_line(text: str, why: str) -> None:
    found = _unmodelled(text)
    assert found and why in found[0] and found[0].startswith("run.sh:")


def test_systemd_unit_environment_and_execstart() -> None:
    unit = (
        "[Unit]\nDescription=llama-server for the chat app\n\n[Service]\n"
        'Environment=LLAMA_ARG_N_PARALLEL=16 "LLAMA_ARG_CACHE_TYPE_K=q8_0"\n'
        f"ExecStart=/usr/bin/llama-server -m /srv/{MODEL}.gguf -c 16384\n"
        "ExecStartPost=/bin/echo llama-server started\n[Install]\nWantedBy=multi-user.target\n"
    )
    cmds = text_commands(unit, "llm.service", Path("/")).commands
    assert [c.origin for c in cmds] == ["llm.service:6"]
    cell = cell_of(cmds[0])
    assert (cell.parallel, cell.ctx, cell.layout_name) == (16, 1024, "split")
    assert cell.flags.cache_types == ("q8_0", "f16")


def test_lines_that_only_look_like_servers_are_not_cells() -> None:
    text = (
        "python3 -m venv .venv\necho llama-server -m x.gguf\n"
        "systemctl restart llama-server\npkill llama-server\n# llama-server -m a.gguf\n"
        "nohup taskset -c 0-3 /opt/llama-server -m /srv/a.gguf -c 2048 -np 2 > log 2>&1 & echo ok\n"
    )
    assert _cells(text) == [("a", 1024, 2, "split")]
    assert _unmodelled(text) == ()


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
    cmds = compose_commands(data, "compose.yml", tmp_path).commands
    assert [c.origin for c in cmds] == ["compose.yml [llm]", "compose.yml [llm2]"]
    first, second = (cell_of(c) for c in cmds)
    assert (first.parallel, first.ctx, first.layout_name) == (4, 1024, "split")
    assert first.model_path == tmp_path / "models" / f"{MODEL}.gguf"
    assert (second.name, second.parallel, second.ctx) == ("b", 2, 1024)
    assert second.model_path is None and "inside the container" in second.not_covered[0]
    assert second.flags.compared()["--ubatch-size"] == "1"


def test_compose_volumes_resolve_by_the_longest_container_prefix(tmp_path: Path) -> None:
    data = {
        "services": {
            "llm": {
                "image": "ghcr.io/ggml-org/llama.cpp:server",
                "command": ["-m", "/models/big/a.gguf", "-c", "4096", "-np", "2"],
                "volumes": ["./all:/models", "/srv/big:/models/big:ro"],
            },
            "shell": {
                "image": "ghcr.io/ggml-org/llama.cpp:full",
                "entrypoint": ["/bin/sh", "-c", "llama-server -m /models/a.gguf -np 8"],
            },
        }
    }
    read = compose_commands(data, "compose.yml", tmp_path)
    (cell,) = (cell_of(c) for c in read.commands)
    assert cell.model_path == Path("/srv/big/a.gguf")
    assert read.unmodelled == ("compose.yml [shell]: entrypoint /bin/sh is not llama-server",)


def test_kubernetes_manifests_are_not_modelled(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n"
        "      containers:\n      - image: ghcr.io/ggml-org/llama.cpp:server\n"
        '        args: ["-m", "/m/a.gguf", "-np", "8"]\n---\napiVersion: v1\nkind: Service\n'
    )
    read = load_deploy_cells(path)
    assert read.cells == () and read.unmodelled[0].startswith("deploy.yaml:7: YAML that is not")


def test_compose_file_is_read_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text(
        "services:\n  llm:\n    image: ghcr.io/ggml-org/llama.cpp:server-cuda\n"
        '    command: ["-m", "/m/a.gguf", "-c", "2048", "-np", "2"]\n'
    )
    assert [(c.name, c.ctx, c.parallel) for c in load_deploy_cells(path).cells] == [("a", 1024, 2)]


def test_models_toml_uses_the_one_registry_reader(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[defaults]\nserver_flags = ["-c", "8192"]\n\n'
        '[[models]]\nalias = "small"\ngguf = "{MODELS_DIR}/small.gguf"\nkv = "q8_0"\n'
        'server_flags = ["-np", "2"]\n'
    )
    (cell,) = load_deploy_cells(path, "/srv").cells
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
    (cell,) = load_deploy_cells(script).cells
    assert (cell.parallel, cell.ctx, cell.not_covered) == (8, 1024, ())
    unit = tmp_path / "llm.service"
    unit.write_text(
        "[Service]\nEnvironmentFile=-/etc/nowhere/llm.env\n"
        "ExecStart=/usr/bin/llama-server -m /m/a.gguf -c 4096 -np 2\n"
    )
    (cell,) = load_deploy_cells(unit).cells
    assert "/etc/nowhere/llm.env not readable here" in cell.not_covered[0]


def test_variables_are_expanded_from_the_file_environment() -> None:
    unit = (
        "[Service]\nEnvironment=NP=8 MODEL=/srv/b.gguf\n"
        "ExecStart=/usr/bin/llama-server -m ${MODEL} -c 8192 -np $NP\n"
    )
    assert _cells(unit, "llm.service") == [("b", 1024, 8, "split")]


def test_systemd_environment_file_overrides_environment_regardless_of_order(
    tmp_path: Path,
) -> None:
    env = tmp_path / "llm.env"
    env.write_text("LLAMA_ARG_N_PARALLEL=8\n")
    unit = (
        f"[Service]\nEnvironmentFile={env}\nEnvironment=LLAMA_ARG_N_PARALLEL=2\n"
        "ExecStart=/usr/bin/llama-server -m /srv/a.gguf -c 8192\n"
    )
    assert _cells(unit, "llm.service") == [("a", 1024, 8, "split")]
    bad = "[Service]\nExecStart=/bin/sh -c 'exec llama-server -m /srv/a.gguf -np 8'\n"
    assert "sh runs a command" in _unmodelled(bad, "llm.service")[0]
    passed = (
        "[Service]\nPassEnvironment=LLAMA_ARG_N_PARALLEL\n"
        "ExecStart=/usr/bin/llama-server -m /a.gguf\n"
    )
    assert "PassEnvironment=LLAMA_ARG_N_PARALLEL" in _unmodelled(passed, "llm.service")[0]


def test_model_identity_uses_the_strongest_check_available(tmp_path: Path) -> None:
    import hashlib

    from batch_invariance.cert.provenance import ModelFileRecord, Provenance
    from batch_invariance.deploy.identity import ModelIdentity, identify_model, model_differences

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF-one")
    recorded = Provenance(
        model_file=ModelFileRecord(
            name="m.gguf", size=8, sha256=hashlib.sha256(b"GGUF-one").hexdigest()
        )
    )
    found = identify_model(model, str(model))
    assert found.method == "sha256" and model_differences(found, recorded) == ()
    no_sha = Provenance(model_file=ModelFileRecord(name="m.gguf", size=8))
    assert model_differences(found, no_sha) == ("the cert records no model sha256",)
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
