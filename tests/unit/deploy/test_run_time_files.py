"""Nothing the check could not see (issue 32, part 4): a file the deploy writes that something
of it reads, a path that is a dangling link or that others could change, and ``~`` as the
shells and compose expand it. Each rule refuses a deploy, naming the path, and a clean twin of
the same deploy passes (end to end against the GREEN of ``test_check_deploy.py``'s ``world``:
started through ``batch-invariance serve``; started directly its cell is covered, and that is
never a pass, issue 40).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from batch_invariance.deploy.gate.cells import load_deploy_cells
from batch_invariance.deploy.readers.config import read_deploy_file, shell_commands
from batch_invariance.deploy.readers.path_trust import trust_problem
from tests.unit.deploy.test_check_deploy import (  # noqa: F401
    OK_FLAGS,
    assert_covered_raw,
    path_line,
    served,
    world,
)

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="chown to another user needs root")
SERVER = f"-c 4096 -np 4 {OK_FLAGS[len('-c 4096 -np 4 ') :]}"


def _script(tmp_path: Path, body: str, name: str = "run.sh") -> Path:
    script = tmp_path / name
    script.write_text("#!/bin/bash\nset -eu\n" + body)
    return script


def _refused(path: Path) -> list[str]:
    return list(load_deploy_cells(path).unmodelled)


def _check(world: dict[str, Path], config: Path) -> int:  # noqa: F811
    return main(["check-deploy", str(config), "--certs", str(world["certs"]), "--allow-unsigned"])


# ---- writes -------------------------------------------------------------------------------


def test_a_written_file_the_script_sources_is_not_understood(tmp_path: Path) -> None:
    env, log = tmp_path / "env.log", tmp_path / "llm.log"
    env.write_text("export LLAMA_ARG_UBATCH=1\n")
    launch = "exec llama-server -m /m/a.gguf -c 4096 -np 4\n"
    write = "echo 'export LLAMA_ARG_UBATCH=512' >> {}\n"
    before, after = write.format(env) + f". {env}\n", f". {env}\n" + write.format(env)
    for body, line in ((before, 2), (after, 3)):  # a restart reads what the last run wrote
        (bad,) = shell_commands("#!/bin/bash\n" + body + launch, "run.sh").not_understood
        assert bad.line == line
        assert f"output written to {env}, which the script sources ({env})" in bad.construct
    twin = write.format(log) + f". {env}\n" + launch
    assert shell_commands("#!/bin/bash\n" + twin, "run.sh").not_understood == ()


def test_the_line_of_the_write_is_named(tmp_path: Path) -> None:
    env = tmp_path / "env.log"
    env.write_text("\n")
    text = f"#!/bin/bash\n. {env}\nexec >> {env} 2>&1\nexec llama-server -m /m/a.gguf\n"
    (bad,) = shell_commands(text, "run.sh").not_understood
    assert (bad.file, bad.line) == ("run.sh", 3) and "sources" in bad.construct


@pytest.mark.parametrize(
    "server",
    [
        "-m {log}", "--model={log}", "--lora {log}", "-m /m/a.gguf --lora=/x/a.gguf,{log}",
        "LLAMA_ARG_MODEL={log}", "LD_PRELOAD={log}", "LD_LIBRARY_PATH=/usr/lib:{log}",
    ],
)  # fmt: skip
def test_a_written_file_the_server_names_anywhere_is_not_understood(
    tmp_path: Path, server: str
) -> None:
    log = tmp_path / "m.log"
    words = server.format(log=log)
    launch = (f"{words} llama-server -m /m/a.gguf" if words[0].isupper()
              else f"llama-server {words}")  # fmt: skip
    text = f"#!/bin/bash\necho hi >> {log}\n{launch} -c 4096 -np 4\n"
    found = shell_commands(text, "run.sh").not_understood
    assert found and found[0].line == 2 and "which run.sh:3 reads" in found[0].construct, found
    twin = text.replace(f">> {log}", f">> {tmp_path / 'other.log'}")
    assert shell_commands(twin, "run.sh").not_understood == ()


def test_a_write_through_a_link_is_not_understood(tmp_path: Path) -> None:
    config = tmp_path / "config.ini"
    (tmp_path / "a.log").symlink_to(config)
    (tmp_path / "logs").symlink_to(tmp_path / "real")
    (tmp_path / "real").mkdir()
    launch = "exec llama-server -m /m/a.gguf\n"
    for log in (tmp_path / "a.log", tmp_path / "logs" / "b.log"):
        found = shell_commands(f"#!/bin/bash\necho x > {log}\n{launch}", "run.sh").not_understood
        assert found and "a link to" in found[0].construct and str(log) in found[0].construct
    twin = f"#!/bin/bash\necho x > {tmp_path / 'real' / 'b.log'}\n{launch}"
    assert shell_commands(twin, "run.sh").not_understood == ()


def test_a_relative_write_in_a_folder_the_reader_lost_is_not_understood(tmp_path: Path) -> None:
    launch = "exec llama-server -m /m/a.gguf\n"
    (bad,) = shell_commands(f"#!/bin/bash\necho x >> llm.log\n{launch}", "run.sh").not_understood
    assert bad.line == 2 and "writing llm.log, relative to a folder" in bad.construct
    (bad,) = shell_commands(f"#!/bin/bash\nmkdir -p logs\n{launch}", "run.sh").not_understood
    assert bad.line == 2 and "writing logs" in bad.construct
    twin = f"#!/bin/bash\ncd {tmp_path} || exit 1\necho x >> llm.log\n{launch}"
    assert shell_commands(twin, "run.sh").not_understood == ()


def test_a_relative_server_path_in_a_lost_folder_is_compared_by_name(tmp_path: Path) -> None:
    text = f"#!/bin/bash\necho x >> {tmp_path}/x.log\nexec llama-server -m x.log\n"
    (bad,) = shell_commands(text, "run.sh").not_understood
    assert "which run.sh:3 reads (x.log)" in bad.construct
    assert shell_commands(text.replace("-m x.log", "-m y.log"), "run.sh").not_understood == ()


def test_mkdir_of_a_path_the_server_reads_is_not_understood(tmp_path: Path) -> None:
    home = tmp_path / "home"
    launch = f"export HOME={home}\nexec llama-server -m /m/a.gguf\n"
    text = f"#!/bin/bash\nmkdir -p {home}/.config/llama.cpp/config.ini\n{launch}"
    (bad,) = shell_commands(text, "run.sh").not_understood
    assert bad.line == 2 and "mkdir -p" in bad.construct and "config.ini" in bad.construct
    twin = f"#!/bin/bash\nmkdir -p {tmp_path}/logs\n{launch}"
    assert shell_commands(twin, "run.sh").not_understood == ()


def test_the_measured_deploy_with_its_logs_passes(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = tmp_path / "llm.log"
    engine = f"llama-server -m {world['model']} {SERVER}"
    body = (
        f"mkdir -p {tmp_path}/logs\n{path_line(world['binary'])}echo starting >> {log}\n"
        f"exec {served(engine, world['certs'])} >> {log} 2>&1\n"
    )
    code = _check(world, _script(tmp_path, body))
    out = capsys.readouterr().out
    assert code == exitcodes.PROMOTABLE, out
    raw = body.replace(served(engine, world["certs"]), engine)
    assert_covered_raw(_check(world, _script(tmp_path, raw)), capsys.readouterr().out)
    bad = body.replace(f"-m {world['model']}", f"-m {world['model']} --lora {log}")
    assert _check(world, _script(tmp_path, bad)) == exitcodes.NOT_PROMOTABLE
    assert "which run.sh:6 reads" in capsys.readouterr().out


# ---- links and files others could change -------------------------------------------------


def _deploy(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path, model: Path, extra: str = "", *, serve: bool = False,
) -> Path:  # fmt: skip
    """The measured server on ``model``, started directly or (``serve``) through serve."""
    engine = f"llama-server -m {model} {SERVER}"
    line = served(engine, world["certs"]) if serve else engine
    return _script(tmp_path, f"{path_line(world['binary'])}{extra}exec {line}\n")


def test_a_dangling_model_link_is_not_understood_and_a_live_one_passes(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    link = tmp_path / "model.gguf"
    link.symlink_to(tmp_path / "filled-later.gguf")
    (bad,) = _refused(_deploy(world, tmp_path, link))
    assert f"run.sh:4: not understood: model {link}: {link} is a dangling link" in bad
    link.unlink()
    link.symlink_to(world["model"])
    assert_covered_raw(_check(world, _deploy(world, tmp_path, link)), capsys.readouterr().out)
    assert _check(world, _deploy(world, tmp_path, link, serve=True)) == exitcodes.PROMOTABLE
    capsys.readouterr()


def test_a_folder_others_can_write_is_not_understood(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    model = shared / "m.gguf"
    model.write_bytes(world["model"].read_bytes())
    shared.chmod(0o777)
    (bad,) = _refused(_deploy(world, tmp_path, model))
    assert f"folder {shared} is writable by others (mode 0777, no sticky bit)" in bad
    shared.chmod(0o755)
    model.chmod(0o666)
    (bad,) = _refused(_deploy(world, tmp_path, model))
    assert f"file {model} is writable by others (mode 0666)" in bad
    model.chmod(0o644)
    assert _refused(_deploy(world, tmp_path, model)) == []
    capsys.readouterr()


@needs_root
def test_a_link_or_file_of_another_user_is_not_understood(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    link = tmp_path / "model.gguf"
    link.symlink_to(world["model"])
    os.lchown(link, 65534, 65534)
    (bad,) = _refused(_deploy(world, tmp_path, link))
    assert f"link {link} belongs to uid 65534, neither you nor root" in bad
    os.lchown(link, 0, 0)
    assert _refused(_deploy(world, tmp_path, link)) == []
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_bytes(world["binary"].read_bytes())
    binary.chmod(0o755)
    os.chown(binary, 65534, 65534)
    body = f"exec {binary} -m {world['model']} {SERVER}\n"
    (bad,) = _refused(_script(tmp_path, body))
    assert f"server binary {binary}: file {binary} belongs to uid 65534" in bad


def test_a_path_folder_before_the_binary_that_others_can_write_is_not_understood(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    early = tmp_path / "early"
    early.mkdir(mode=0o777)
    early.chmod(0o777)
    body = (
        f"export PATH={early}:{world['binary'].parent}:/usr/bin:/bin\n"
        f"exec llama-server -m {world['model']} {SERVER}\n"
    )
    (bad,) = _refused(_script(tmp_path, body))
    assert f"PATH folder {early}: folder {early} is writable by others" in bad
    early.chmod(0o755)
    assert _refused(_script(tmp_path, body)) == []


def test_a_sourced_file_that_is_a_dangling_link_or_shared_is_not_understood(
    tmp_path: Path,
) -> None:
    env = tmp_path / "env.sh"
    env.symlink_to(tmp_path / "nothing.sh")
    text = f"#!/bin/bash\n. {env}\nexec llama-server -m /m/a.gguf\n"
    found = shell_commands(text, "run.sh").not_understood
    assert "is a dangling link" in found[0].construct and found[1].line == 2
    env.unlink()
    env.write_text("export LLAMA_ARG_UBATCH=1\n")
    env.chmod(0o664)
    found = shell_commands(text, "run.sh").not_understood
    assert f"file {env} is writable by others (mode 0664)" in found[0].construct
    env.chmod(0o644)
    assert shell_commands(text, "run.sh").not_understood == ()


def test_an_optional_environment_file_others_could_create_is_not_understood(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # sticky, like /tmp: anyone may create a file there
    unit = tmp_path / "llm.service"
    unit.write_text(
        f"[Service]\nEnvironmentFile=-{shared}/llm.env\n"
        "ExecStart=/usr/bin/llama-server -m /m/a.gguf -c 4096 -np 4\n"
    )
    (bad,) = read_deploy_file(unit).not_understood
    assert bad.line == 2 and "anyone could create it after the check" in bad.construct
    shared.chmod(0o755)
    read = read_deploy_file(unit)
    assert read.not_understood == () and "absent here" in read.commands[0].notes[0]


def test_a_config_file_link_or_a_config_folder_others_can_write_is_not_understood(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    (home / ".config" / "llama.cpp").mkdir(parents=True)
    config = home / ".config" / "llama.cpp" / "config.ini"
    config.symlink_to(tmp_path / "filled-by-the-script.ini")
    extra = f"export HOME={home}\n"
    found = _refused(_deploy(world, tmp_path, world["model"], extra))
    assert any(f"config file {config}: {config} is a dangling link" in f for f in found), found
    config.unlink()
    assert _refused(_deploy(world, tmp_path, world["model"], extra)) == []
    (home / ".config").chmod(0o777)
    (bad,) = _refused(_deploy(world, tmp_path, world["model"], extra))
    assert f"folder {home / '.config'} is writable by others" in bad


def test_a_working_folder_others_can_write_is_not_understood(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o775)
    extra = f"cd {work} || exit 1\n"
    (bad,) = _refused(_deploy(world, tmp_path, world["model"], extra))
    assert f"working folder {work}: folder {work} is writable by others" in bad
    work.chmod(0o755)
    assert _refused(_deploy(world, tmp_path, world["model"], extra)) == []


def test_links_are_walked_as_the_kernel_walks_them(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert "more than 40 links" in (trust_problem("model", str(tmp_path / "a")) or "")
    real = tmp_path / "real" / "sub"
    real.mkdir(parents=True)
    (real.parent / "m.gguf").write_text("x")
    (tmp_path / "via").symlink_to(real)
    # via/.. is real/ (the kernel takes .. on the real folder), not tmp_path: m.gguf is there.
    assert trust_problem("model", f"{tmp_path}/via/../m.gguf") is None
    (tmp_path / "gone").symlink_to("missing/deeper")
    assert "gone is a dangling link" in (trust_problem("model", f"{tmp_path}/gone/x") or "")
    assert trust_problem("model", f"{tmp_path}/absent/x") is None  # the caller says "not here"


# ---- ~ as the programs expand it ---------------------------------------------------------


@pytest.mark.parametrize(
    "word",
    ["~/m.gguf", "~", "~root/m.gguf", "a=~/m.gguf", "--model=~/x"],
)
def test_an_unquoted_tilde_is_not_understood(word: str) -> None:
    for line in (f"llama-server -m /m/a.gguf {word}", f"X={word}\nllama-server -m /m/a.gguf"):
        found = shell_commands(f"#!/bin/bash\n{line}\n", "run.sh").not_understood
        assert found and found[0].line == 2 and "'~'" in found[0].construct, (line, found)


@pytest.mark.parametrize("word", ["'~/m.gguf'", '"~/m.gguf"', "\\~/m.gguf"])
def test_a_quoted_tilde_is_a_folder_named_tilde(tmp_path: Path, word: str) -> None:
    """bash and dash pass a quoted ``~`` on as it is, and llama-server opens ``~/m.gguf`` in its
    working folder: never the checking user's HOME."""
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/sh\ncd {tmp_path} || exit 1\nllama-server -m {word} -np 1\n")
    (cell,) = load_deploy_cells(script).cells
    assert cell.model == "~/m.gguf" and cell.model_path == tmp_path / "~" / "m.gguf"


def test_compose_and_models_toml_tilde_is_not_understood(tmp_path: Path) -> None:
    compose = tmp_path / "compose.yaml"
    service = "services:\n  llm:\n    image: ghcr.io/ggml-org/llama.cpp:server\n"
    compose.write_text(service + "    env_file: ~/llm.env\n    command: -m /m/a.gguf\n")
    (bad,) = read_deploy_file(compose).not_understood
    assert "env_file ~/llm.env (compose expands ~" in bad.construct
    compose.write_text(
        service + "    volumes: [{type: bind, source: ~/models, target: /models, "
        "read_only: true}]\n    command: -m /models/a.gguf\n"
    )
    (bad,) = read_deploy_file(compose).not_understood
    assert "bind mount ~/models at /models" in bad.construct
    toml = tmp_path / "models.toml"
    toml.write_text('[[models]]\nalias = "g"\ngguf = "~/m.gguf"\nkv = "f16"\n')
    (bad,) = read_deploy_file(toml).not_understood
    assert "[g] gguf ~/m.gguf (~ is the HOME of whoever runs run-live" in bad.construct


def test_compose_links_inside_a_bind_mount_and_a_shared_dot_env(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "a.gguf").symlink_to("/srv/elsewhere.gguf")
    (tmp_path / "real.gguf").write_text("x")
    (models / "b.gguf").symlink_to(tmp_path / "real.gguf")
    compose = tmp_path / "compose.yaml"
    text = (
        "services:\n  llm:\n    image: ghcr.io/ggml-org/llama.cpp:server\n"
        "    volumes: ['./models:/models:ro']\n    command: -m /models/{} -np 1\n"
    )
    for name in ("a.gguf", "b.gguf"):
        compose.write_text(text.format(name))
        (bad,) = _refused(compose)
        assert f"{models / name} is a link inside the bind mount {models}" in bad
    (models / "c.gguf").write_text("x")
    compose.write_text(text.format("c.gguf"))
    assert _refused(compose) == []
    tmp_path.chmod(0o1777)
    try:
        (bad,) = _refused(compose)
        assert ".env does not exist and folder" in bad
    finally:
        tmp_path.chmod(0o700)


def test_a_deploy_file_others_can_change_is_not_understood(tmp_path: Path) -> None:
    script = _script(tmp_path, "exec llama-server -m /m/a.gguf\n")
    script.chmod(0o666)
    (bad,) = read_deploy_file(script).not_understood
    assert f"deploy file {script}: file {script} is writable by others" in bad.construct
    script.chmod(0o644)
    assert read_deploy_file(script).not_understood == ()
