"""Reading deploy files inside closed grammars: which servers run, with which cell, and every
line outside the grammar named (file, line, construct)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance.deploy.gate.cells import cell_of, load_deploy_cells
from batch_invariance.deploy.readers.commands import DeployRead, ServerCommand
from batch_invariance.deploy.readers.config import read_deploy_file, shell_commands
from batch_invariance.errors import UsageError

MODEL = "gemma-3-270m-q4_k_m"


def _read(text: str, name: str = "run.sh") -> DeployRead:
    return shell_commands(text, name)


def _cells(text: str) -> list[tuple[str, int | None, int, str]]:
    read = _read(text)
    assert read.not_understood == (), read.unmodelled
    return [(c.name, c.ctx, c.parallel, c.layout_name) for c in (cell_of(x) for x in read.commands)]


def _refused(text: str, name: str = "run.sh") -> str:
    found = _read(text, name).unmodelled
    assert found, f"passed: {text!r}"
    return found[0]


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


def test_assignments_apply_in_order_and_exports_reach_the_server() -> None:
    text = f"export LLAMA_ARG_N_PARALLEL=8\nllama-server -m /m/{MODEL}.gguf -c 8192 -kvu\n"
    assert _cells(text) == [(MODEL, 1024, 8, "unified")]
    # A later export does not reach an earlier server; a flag beats the variable.
    text = "llama-server -m a.gguf -c 4096 -np 2\nexport LLAMA_ARG_N_PARALLEL=8 X=1\n"
    assert _cells(text) == [("a", 2048, 2, "split")]
    text = "LLAMA_ARG_CTX_SIZE=4096 LLAMA_ARG_N_PARALLEL=2 LLAMA_ARG_MODEL=/m/b.gguf llama-server\n"
    assert _cells(text) == [("b", 2048, 2, "split")]
    text = (
        "NP=8\nllama-server -m /m/a.gguf -c 8192 -np $NP\n"
        "NP=4\nllama-server -m /m/b.gguf -c 4096 -np $NP\n"
    )
    assert _cells(text) == [("a", 1024, 8, "split"), ("b", 1024, 4, "split")]
    # set -a exports every later assignment.
    assert _cells("set -a\nLLAMA_ARG_N_PARALLEL=8\nllama-server -m /m/a.gguf -c 8192\n") == [
        ("a", 1024, 8, "split")
    ]
    # A variable the server reads, assigned without export: the caller decides whether the
    # server gets it (it may have exported that name), so it is not understood.
    found = _refused("LLAMA_ARG_N_PARALLEL=8\nllama-server -m /m/a.gguf -c 8192\n")
    assert found.startswith("run.sh:1: not understood: LLAMA_ARG_N_PARALLEL assigned without")


def test_prefix_assignments_expand_before_they_apply() -> None:
    assert _cells("N=4\nN=1 llama-server -m /m/a.gguf -c 4096 -np $N\n") == [
        ("a", 1024, 4, "split")
    ]


def test_env_i_resets_the_environment_and_env_is_a_system_path_once_path_is_set() -> None:
    text = (
        "export LLAMA_ARG_N_PARALLEL=8\n"
        "env -i LLAMA_ARG_CTX_SIZE=4096 llama-server -m /m/a.gguf -np 2\n"
        "llama-server -m /m/a.gguf -c 8192\n"
    )
    assert _cells(text) == [("a", 2048, 2, "split"), ("a", 1024, 8, "split")]
    assert "write /usr/bin/env" in _refused("PATH=/opt/bin\nenv -i llama-server -m /m/a.gguf\n")
    assert "env -u" in _refused("env -u X llama-server -m /m/a.gguf\n")
    # With env -i, glibc's execvp searches the new environment's PATH, else /bin:/usr/bin.
    (command,) = _read("export PATH=/opt/bin\n/usr/bin/env -i llama-server -m a.gguf\n").commands
    assert command.search_path == "/bin:/usr/bin"


def test_cd_fixes_the_folder_only_when_a_failed_cd_stops_the_script() -> None:
    for text in ("set -e\ncd /srv/models\n", "cd /srv/models || exit 1\n"):
        (command,) = _read(text + "llama-server -m a.gguf -c 4096 -np 2\n").commands
        assert cell_of(command).model_path == Path("/srv/models/a.gguf")
    (command,) = _read("cd /srv/models\nllama-server -m a.gguf -c 4096 -np 2\n").commands
    cell = cell_of(command)
    assert cell.model_path is None and "could not follow" in " ".join(cell.not_covered)
    assert "cd to an absolute folder" in _refused("cd models || exit 1\nllama-server -m a\n")


def test_hash_inside_a_word_and_a_comment_ending_in_a_backslash() -> None:
    assert _cells("llama-server -m /m/a.gguf --api-key team#42 -c 65536 -np 16\n") == [
        ("a", 4096, 16, "split")
    ]
    assert _cells("# start it \\\nllama-server -m /m/a.gguf -c 4096 -np 2\n") == [
        ("a", 2048, 2, "split")
    ]


#: Constructs outside the shell grammar (the issue's list and more), each on line 2.
OUTSIDE = [
    ("declare -x LLAMA_ARG_UBATCH=512", "running declare"),
    ("printf -v LLAMA_ARG_UBATCH 512", "printf -v"),
    ("read -r NP < /etc/np", "running read"),
    ("(( NP = 8 ))", "operator ("),
    ("IFS=,", "assigning IFS"),
    ("llama-server -m /m/{a,b}.gguf -np 8", "unquoted '{'"),
    ("set -o allexport -o posix", "set -o"),
    ("trap 'llama-server -m /m/a.gguf -np 8' EXIT", "running trap"),
    ("eval llama-server -np 8", "running eval"),
    ("alias llama-server='llama-server -np 8'", "running alias"),
    ("start() { llama-server -np 8; }", "operator ("),
    ("[ -f /etc/skip ] && exit 0", "operator &&"),
    ("env --unset=LLAMA_ARG_N_PARALLEL llama-server -m /m/a.gguf", "env --unset"),
    ("env --chdir=/srv llama-server -m a.gguf", "env --chdir"),
    ("env -S 'llama-server -np 8'", "env -S"),
    ("pushd /srv", "running pushd"),
    ("PATH=$PATH:/opt/bin", "$PATH, which this file does not set"),
    ("curl -o /m/a.gguf https://example.com/other.gguf", "running curl"),
    ("cp /tmp/other.gguf /m/a.gguf", "running cp"),
    ("export XDG_CONFIG_HOME=/tmp/cfg; echo '[*]' > /tmp/cfg/llama.cpp/config.ini", "written to"),
    ("for n in 4 8; do llama-server -np $n; done", "running for"),
    ("if true; then llama-server -np 8; fi", "running if"),
    ("llama-server -m $(ls /m/*.gguf) -np 8", "command substitution"),
    ("llama-server -m /m/*.gguf -np 8", "unquoted '*'"),
    ("llama-server -m ~/a.gguf -np 8", "unquoted '~'"),
    ("llama-server -m ${M:-/m/a.gguf} -np 8", "parameter expansion"),
    ("cat > run.sh <<EOF", "here-document"),
    ("sudo -u llm llama-server -m /m/a.gguf", "running sudo"),
    ("bash -c 'llama-server -np 8'", "running bash"),
    ("llama-server -m /m/a.gguf -np $UNSET", "$UNSET, which this file does not set"),
    ("export -n LLAMA_ARG_N_PARALLEL", "export -n"),
    ("exec -a x llama-server -m /m/a.gguf", "running -a"),
    ("llama-server -m /m/a.gguf | tee x", "operator |"),
    ("llama-server -m /m/a.gguf > /m/a.json", "output written to /m/a.json"),
    (". env.sh", "the shell looks it up on PATH"),
    ("shopt -s expand_aliases", "running shopt"),
    ("llama-server -m /m/a.gguf || exit 1", "take || exit"),
    ("BASH_ENV=/tmp/x", "assigning BASH_ENV"),
]


@pytest.mark.parametrize(("line", "why"), OUTSIDE, ids=[w for _, w in OUTSIDE])
def test_constructs_outside_the_grammar_are_named_with_their_line(line: str, why: str) -> None:
    text = f"set -e\n{line}\nllama-server -m /m/a.gguf -c 4096 -np 4\n"
    found = _refused(text)
    assert found.startswith("run.sh:2: not understood: ") and why in found, found


def test_a_cr_byte_is_not_understood() -> None:
    assert "CR byte" in _refused("llama-server -m /m/a.gguf -np 8\r\n")


#: Correct deploys with ordinary lines: they pass (issue 24's false alarms).
ORDINARY = (
    "#!/usr/bin/env bash\n"
    "set -euo pipefail\n"
    "export PATH=/opt/llama/bin:/usr/bin:/bin\n"
    "mkdir_done=1\n"
    'echo "starting llama-server" >> /var/log/llm.log\n'
    "test -x /opt/llama/bin/llama-server || exit 1\n"
    "[ -f /m/a.gguf ] || exit 1\n"
    "cd /srv\n"
    "exec >> /var/log/llm.log 2>&1\n"
    "exec llama-server -m /m/a.gguf -c 4096 -np 4 --host 0.0.0.0 --port 8080\n"
    'echo "never reached"\n'
    "for x in 1 2; do rm -rf /; done\n"
)


def test_ordinary_correct_lines_pass() -> None:
    read = _read(ORDINARY)
    assert read.not_understood == ()
    (command,) = read.commands
    assert command.origin == "run.sh:10" and command.base_dir == Path("/srv")
    assert command.search_path == "/opt/llama/bin:/usr/bin:/bin"
    background = "llama-server -m /m/a.gguf -np 2 > /var/log/a.log 2>&1 &\nwait\n"
    assert len(_read(background).commands) == 1 and _read(background).not_understood == ()


def test_sourced_files_are_read_with_the_same_grammar(tmp_path: Path) -> None:
    (tmp_path / "env.sh").write_text("# shared settings\nexport LLAMA_ARG_N_PARALLEL=8\n")
    script = tmp_path / "run.sh"
    script.write_text(f". {tmp_path}/env.sh\nllama-server -m /m/a.gguf -c 8192\n")
    (cell,) = load_deploy_cells(script).cells
    assert (cell.parallel, cell.ctx) == (8, 1024)
    (tmp_path / "env.sh").write_text("declare -x LLAMA_ARG_N_PARALLEL=8\n")
    found = load_deploy_cells(script).unmodelled
    assert found[0].startswith(f"{tmp_path}/env.sh:1: not understood: running declare")


# --------------------------------------------------------------------------- systemd


def _unit(tmp_path: Path, text: str, drop_ins: dict[str, str] | None = None) -> DeployRead:
    unit = tmp_path / "llm.service"
    unit.write_text(text)
    for name, body in (drop_ins or {}).items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return read_deploy_file(unit)


def test_systemd_unit_environment_and_execstart(tmp_path: Path) -> None:
    read = _unit(
        tmp_path,
        "[Unit]\nDescription=llama-server for the chat app\n\n[Service]\n"
        'Environment=LLAMA_ARG_N_PARALLEL=16 "LLAMA_ARG_CACHE_TYPE_K=q8_0"\n'
        f"ExecStart=/usr/bin/llama-server -m /srv/{MODEL}.gguf -c 16384\n"
        "Restart=on-failure\n[Install]\nWantedBy=multi-user.target\n",
    )
    assert read.not_understood == ()
    (command,) = read.commands
    assert command.origin == "llm.service:6"
    cell = cell_of(command)
    assert (cell.parallel, cell.ctx, cell.layout_name) == (16, 1024, "split")
    assert cell.flags.cache_types == ("q8_0", "f16")


def test_systemd_drop_ins_apply_in_file_name_order_and_reset(tmp_path: Path) -> None:
    base = "[Service]\nEnvironment=LLAMA_ARG_N_PARALLEL=2\nExecStart=/usr/bin/llama-server -m /m/a.gguf -c 4096\n"  # noqa: E501
    read = _unit(
        tmp_path, base,
        {"llm.service.d/20-n.conf": "[Service]\nEnvironment=LLAMA_ARG_N_PARALLEL=8\n",
         "llm.service.d/10-exec.conf": "[Service]\nExecStart=\n"
                                       "ExecStart=/usr/bin/llama-server -m /m/b.gguf -c 8192\n",
         "service.d/05-all.conf": "[Service]\nEnvironment=LLAMA_ARG_UBATCH=1\n"},
    )  # fmt: skip
    assert read.not_understood == ()
    (command,) = read.commands
    cell = cell_of(command)
    assert (cell.name, cell.parallel, cell.ctx) == ("b", 8, 1024)
    assert command.origin.endswith("10-exec.conf:3") and command.env["LLAMA_ARG_UBATCH"] == "1"
    read = _unit(tmp_path, base, {"llm.service.d/30-pass.conf": "[Service]\nPassEnvironment=X\n"})
    assert "30-pass.conf:2: not understood: PassEnvironment= in [Service]" in read.unmodelled[0]


def test_systemd_environment_files_follow_systemds_rules(tmp_path: Path) -> None:
    env = tmp_path / "llm.env"
    env.write_text("# settings\nLLAMA_ARG_N_PARALLEL=8\n")
    head = "[Service]\nExecStart=/usr/bin/llama-server -m /srv/a.gguf -c 8192\n"
    # EnvironmentFile= overrides Environment= wherever it appears.
    read = _unit(tmp_path, head + f"EnvironmentFile={env}\nEnvironment=LLAMA_ARG_N_PARALLEL=2\n")
    assert cell_of(read.commands[0]).parallel == 8
    # An optional file that is absent: nothing set, said on the pass line.
    read = _unit(tmp_path, head + "EnvironmentFile=-/etc/nowhere/llm.env\n")
    assert read.not_understood == () and "absent here" in read.commands[0].notes[0]
    env.write_text("LLAMA_ARG_N_PARALLEL = 8\n")
    assert (
        "llm.env:1: not understood: environment line"
        in _unit(tmp_path, head + f"EnvironmentFile={env}\n").unmodelled[0]
    )
    env.write_text('LLAMA_ARG_N_PARALLEL="8"\n')
    assert (
        "value of LLAMA_ARG_N_PARALLEL"
        in _unit(tmp_path, head + f"EnvironmentFile={env}\n").unmodelled[0]
    )


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("ExecStartPre=/usr/bin/curl -o /srv/a.gguf https://x", "ExecStartPre= in [Service]"),
        ("RootDirectory=/srv/root", "RootDirectory= in [Service]"),
        ("BindReadOnlyPaths=/srv/other:/srv", "BindReadOnlyPaths= in [Service]"),
        ("UnsetEnvironment=LLAMA_ARG_N_PARALLEL=4", "UnsetEnvironment=LLAMA_ARG_N_PARALLEL=4"),
        ("Environment=LLAMA_ARG_API_KEY=a#b", "Environment= word"),
        ("Environment=X=$HOME", "Environment= word"),
        ("WorkingDirectory=%h", "a % specifier"),
        ("Environment=A=1 \\\n# a comment\n  B=2", "a comment inside a \\ continuation"),
        ("PassEnvironment=LLAMA_ARG_N_PARALLEL", "PassEnvironment="),
        ("Type=forking", "Type=forking"),
        ("StandardOutput=file:/srv/a.gguf", "StandardOutput=file:/srv/a.gguf"),
    ],
)
def test_systemd_lines_outside_the_grammar(tmp_path: Path, line: str, why: str) -> None:
    text = f"[Service]\n{line}\nExecStart=/usr/bin/llama-server -m /srv/a.gguf -np 4\n"
    found = _unit(tmp_path, text).unmodelled
    number = 2 + line.count("# a comment")  # a comment is named on its own line
    assert found and found[0].startswith(f"llm.service:{number}: not understood: "), found
    assert why in found[0]


def test_systemd_execstart_is_split_as_systemd_splits_it(tmp_path: Path) -> None:
    read = _unit(
        tmp_path,
        '[Service]\nEnvironment="FLAGS=-c 8192 -np 8" M=/srv/a.gguf\n'
        "ExecStart=-/usr/bin/llama-server -m ${M} $FLAGS\n",
    )
    assert read.commands[0].argv == ("/usr/bin/llama-server", "-m", "/srv/a.gguf", "-c", "8192",
                                     "-np", "8")  # fmt: skip
    found = _unit(tmp_path, "[Service]\nExecStart=llama-server -m /a.gguf\n").unmodelled
    assert "not an absolute path" in found[0]
    found = _unit(tmp_path, "[Service]\nExecStart=/usr/bin/llama-server -m $M\n").unmodelled
    assert "$M, which no Environment= of this unit sets" in found[0]
    found = _unit(tmp_path, "[Service]\nExecStart=@/usr/bin/llama-server x -m /a.gguf\n").unmodelled
    assert "ExecStart= prefix @" in found[0]


# --------------------------------------------------------------------------- compose


def _compose(tmp_path: Path, text: str, files: dict[str, str] | None = None) -> DeployRead:
    path = tmp_path / "compose.yaml"
    path.write_text(text)
    for name, body in (files or {}).items():
        (tmp_path / name).write_text(body)
    return read_deploy_file(path)


SERVICE = (
    "services:\n  llm:\n    image: ghcr.io/ggml-org/llama.cpp:server\n"
    "    volumes: ['./models:/models:ro']\n"
    f"    command: ['-m', '/models/{MODEL}.gguf', '-c', '4096', '-np', '4']\n"
)


def test_compose_services_are_read_and_an_override_file_is_not_understood(
    tmp_path: Path,
) -> None:
    read = _compose(tmp_path, SERVICE + "    environment:\n      LLAMA_ARG_UBATCH: '1'\n")
    assert read.not_understood == ()
    cell = cell_of(read.commands[0])
    assert cell.model_path == (tmp_path / "models" / f"{MODEL}.gguf")
    assert (cell.parallel, cell.ctx) == (4, 1024) and cell.flags.compared()["--ubatch-size"] == "1"
    override = (
        "services:\n  llm:\n    command: ['-m', '/models/b.gguf', '-c', '8192', '-np', '8']\n"
        "    environment: ['LLAMA_ARG_UBATCH=512']\n"
    )
    base = SERVICE + "    environment: {LLAMA_ARG_UBATCH: '1', LLAMA_ARG_THREADS: '4'}\n"
    # `docker compose` merges it without -f, not with -f compose.yaml: the checker merges
    # nothing, so the deploy is not understood (tests/unit/deploy/test_compose.py).
    found = _compose(tmp_path, base, {"compose.override.yaml": override}).unmodelled
    assert found[0].startswith("compose.override.yaml: not understood: override file")


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ("    extends: {file: base.yml, service: llm}\n", "key extends of a server service"),
        ("    environment: [LLAMA_ARG_UBATCH]\n", "without a value"),
        ("    environment:\n      LLAMA_ARG_UBATCH:\n", "without a value"),
        ("    environment:\n      LLAMA_ARG_UBATCH: 0x200\n", "plain YAML value '0x200'"),
        ("    environment:\n      LLAMA_ARG_FLASH_ATTN: on\n", "plain YAML value 'on'"),
        ("    environment:\n      LLAMA_ARG_UBATCH: ${UB}\n", "a $"),
        ("    working_dir: /srv\n    privileged: true\n", "plain YAML value 'true'"),
        ("    entrypoint: ['/bin/sh', '-c', 'llama-server -np 8']\n", "mentions a server"),
    ],
)
def test_compose_constructs_outside_the_grammar(tmp_path: Path, extra: str, why: str) -> None:
    found = _compose(tmp_path, SERVICE + extra).unmodelled
    assert found and "not understood" in found[0] and why in found[0], found


def test_compose_volumes_that_could_hold_other_files_are_not_understood(tmp_path: Path) -> None:
    named = SERVICE.replace("['./models:/models:ro']", "['./models:/models', 'm:/models/v2']")
    assert "a named volume" in _compose(tmp_path, named).unmodelled[0]
    config = tmp_path / "etc" / "llama.cpp" / "config.ini"
    config.parent.mkdir(parents=True)
    config.write_text("[*]\nubatch-size = 512\n")
    mounted = SERVICE.replace("['./models:/models:ro']", "['./models:/models', './etc:/etc']")
    assert "which the server reads" in _compose(tmp_path, mounted).unmodelled[0]
    writer = SERVICE + "  fetch:\n    image: alpine\n    volumes: ['./models:/data']\n"
    assert "[fetch] binds ./models writable" in _compose(tmp_path, writer).unmodelled[0]
    dot_env = _compose(tmp_path, SERVICE, {".env": "COMPOSE_FILE=other.yaml\n"})
    assert "COMPOSE_FILE in .env" in dot_env.unmodelled[0]


def test_compose_volumes_resolve_by_the_longest_container_prefix(tmp_path: Path) -> None:
    text = (
        "services:\n  llm:\n    image: ghcr.io/ggml-org/llama.cpp:server\n"
        "    command: ['-m', '/models/big/a.gguf', '-c', '4096', '-np', '2']\n"
        "    volumes: ['./all:/models', '/srv/big:/models/big:ro']\n"
    )
    (cell,) = (cell_of(c) for c in _compose(tmp_path, text).commands)
    assert cell.model_path == Path("/srv/big/a.gguf")


def test_a_kubernetes_manifest_is_read_as_the_containers_it_starts(tmp_path: Path) -> None:
    """A YAML file of apiVersion/kind documents is a manifest, not a compose file: a llama.cpp
    :server container is a server started directly (never a pass; tests/unit/deploy/
    test_kubernetes.py), read with the image's entrypoint."""
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n"
        "      containers:\n      - image: ghcr.io/ggml-org/llama.cpp:server\n"
        "        args: [-m, /m/a.gguf, -c, '4096', -np, '4']\n"
    )
    read = load_deploy_cells(path)
    (cell,) = read.cells
    assert read.unmodelled == ()
    assert (cell.binary, cell.parallel, cell.serve_options) == ("/app/llama-server", 4, None)
    assert cell.image == "ghcr.io/ggml-org/llama.cpp:server"


def test_models_toml_uses_the_one_registry_reader(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[defaults]\nserver_flags = ["-c", "8192"]\n\n'
        '[[models]]\nalias = "small"\ngguf = "{MODELS_DIR}/small.gguf"\nkv = "q8_0"\n'
        'server_flags = ["-np", "2"]\n'
    )
    (cell,) = load_deploy_cells(path, "/srv").cells
    assert (cell.alias, cell.model, cell.ctx, cell.parallel) == ("small", "/srv/small.gguf",
                                                                 4096, 2)  # fmt: skip
    assert cell.flags.cache_types == ("q8_0", "q8_0")
    with pytest.raises(UsageError, match="no models folder was given"):
        load_deploy_cells(path, None)


def test_bad_values_and_empty_files_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"deploy.sh:1: -np needs an integer"):
        cell_of(ServerCommand("deploy.sh:1", ("llama-server", "-m", "a.gguf", "-np", "four"), {}))
    with pytest.raises(UsageError, match="no model"):
        cell_of(ServerCommand("deploy.sh:1", ("llama-server", "-c", "4096"), {}))
    config = tmp_path / "deploy.sh"
    config.write_text("echo nothing here\n")
    with pytest.raises(UsageError, match="no llama-server command line"):
        load_deploy_cells(config)


def test_model_identity_uses_the_strongest_check_available(tmp_path: Path) -> None:
    import hashlib

    from batch_invariance.cert.provenance import ModelFileRecord, Provenance
    from batch_invariance.deploy.gate.identity import (
        ModelIdentity,
        identify_model,
        model_differences,
    )

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
    by_stat = ModelIdentity("size and name", "m.gguf", size=8)
    assert model_differences(by_stat, recorded) == ()
    assert model_differences(ModelIdentity("size and name", "m.gguf", size=9), recorded)
    assert (
        "cannot be checked"
        in model_differences(identify_model(tmp_path / "x.gguf", "x"), recorded)[0]
    )
    hub = identify_model(None, "org/repo:Q4_K_M")
    assert hub.method == "nothing" and model_differences(hub, recorded)


# --------------------------------------------------------------------------- exact readings


def test_prefix_assignments_apply_left_to_right_as_the_shells_assign_them() -> None:
    # bash and dash: B=$A on the same line sees A=1; the arguments still see the old A.
    (command,) = _read("A=0\nexport A\nA=1 B=$A llama-server -m /m/a.gguf -a $A\n").commands
    assert command.env["B"] == "1" and command.argv[-1] == "0"


def test_words_the_shells_read_differently_are_not_understood() -> None:
    assert "locale quoting" in _refused('llama-server -m /m/a.gguf --alias $"x"\n')
    assert "descriptor 10" in _refused("llama-server -m /m/a.gguf 10>/dev/null\n")
    # A quoted number before > is an argument, not a descriptor.
    (command,) = _read('llama-server -m /m/a.gguf "2">/dev/null\n').commands
    assert command.argv[-1] == "2"
    # An unquoted expansion is split at space, tab and newline only; a backslash in it could
    # be a pattern (bash 5.0), so it is refused.
    (command,) = _read("F=' -c\t4096  -np 4'\nllama-server -m /m/a.gguf $F\n").commands
    assert command.argv[-4:] == ("-c", "4096", "-np", "4")
    assert "pattern character" in _refused("F='a\\b'\nllama-server -m /m/a.gguf $F\n")
    assert "env /usr/bin/llama-server=x" in _refused(
        "/usr/bin/env /usr/bin/llama-server=x /usr/bin/llama-server -m /m/a.gguf\n"
    )


def test_systemd_lines_are_joined_and_split_as_systemd_does(tmp_path: Path) -> None:
    # A continuation: the backslash becomes a space and the next raw line is appended.
    read = _unit(
        tmp_path,
        '[Service]\nEnvironment="LLAMA_ARG_ALIAS=a \\\n   b" \\\n\tX=1\n'
        "ExecStart=/usr/bin/llama-server -m /srv/a.gguf\n",
    )
    assert read.not_understood == (), read.unmodelled
    assert read.commands[0].env["LLAMA_ARG_ALIAS"] == "a     b"
    assert read.commands[0].env["X"] == "1"
    # A quote inside a word: systemd joins the pieces ("A=1"B=2 is one word A=1B=2).
    for line in ('Environment="A=1"B=2', 'Environment=A="1 2"', "Environment='A=1'"):
        found = _unit(tmp_path, f"[Service]\n{line}\nExecStart=/usr/bin/llama-server\n")
        assert found.unmodelled and found.not_understood[0].line == 2, line
    found = _unit(tmp_path, '[Service]\nExecStart=/usr/bin/llama-server "-m"/a.gguf\n')
    assert "a quote that does not enclose a whole word" in found.unmodelled[0]
    found = _unit(tmp_path, "[Service]\nExecStart=- /usr/bin/llama-server -m /a.gguf\n")
    assert "a blank after its prefix" in found.unmodelled[0]
    # $NAME as a whole word is split at systemd's whitespace (space and tab here).
    read = _unit(
        tmp_path,
        '[Service]\nEnvironment="F=-c 4096  -np 4"\nExecStart=/usr/bin/llama-server $F\n',
    )
    assert read.commands[0].argv[1:] == ("-c", "4096", "-np", "4")


def test_the_format_is_decided_by_the_name_as_the_runner_decides(tmp_path: Path) -> None:
    from batch_invariance.deploy.readers.config import deploy_format

    assert [deploy_format(Path(n)) for n in ("a.service", "c.yml", "m.toml", "run", "x.sh")] == [
        "unit", "compose", "toml", "shell", "shell"
    ]  # fmt: skip
    # A unit's header in a script is a shell word; a script's #! in a unit is a comment.
    script = tmp_path / "run.sh"
    script.write_text("[Service]\nExecStart=/usr/bin/llama-server -m /a.gguf\n")
    assert read_deploy_file(script).not_understood[0].line == 1
    timer = tmp_path / "llm.timer"
    timer.write_text("[Timer]\nOnBootSec=1\n")
    assert "a .timer file" in read_deploy_file(timer).unmodelled[0]
