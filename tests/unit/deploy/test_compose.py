"""A compose project as `docker compose` runs it (issue 32): the files it picks and merges, mounts
over what the image runs, a digest-pinned image; refused by the reader at its line otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.deploy.readers.compose import DEFAULT_FILES, OVERRIDES, project_problems
from batch_invariance.deploy.readers.compose import compose_commands as read
from batch_invariance.deploy.readers.compose_service import image_tag
from tests.support.deploy_world import MODEL, OK_FLAGS, Capsys, World, assert_covered_raw, gate

DIGEST = "sha256:" + "0123456789abcdef" * 4
TAGGED = "ghcr.io/ggml-org/llama.cpp:server"


def _service(image: str = TAGGED, extra: str = "", volumes: str = "'./models:/models:ro'") -> str:
    return (
        f"services:\n  llm:\n    image: {image}\n    volumes: [{volumes}]\n"
        f"    command: -m /models/{MODEL}.gguf {OK_FLAGS}\n{extra}"
    )


def _check(world: World, tmp_path: Path, capsys: Capsys, body: str, *extra: str) -> tuple[int, str]:
    folder = tmp_path / "deploy"
    folder.mkdir(exist_ok=True)
    if not (folder / "models").exists():
        (folder / "models").symlink_to(world["model"].parent)
    (folder / "compose.yaml").write_text(body)
    binary = str(world["binary"])
    code = gate(folder / "compose.yaml", world["certs"], "--server-binary", binary, *extra)
    return code, "".join(capsys.readouterr())


def _refused(tmp_path: Path, body: str) -> str:
    found = read(tmp_path / "compose.yaml", body).unmodelled
    assert found, body
    return found[0]


def test_a_digest_pinned_server_image_is_the_server_image(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    """Covered (the image starts llama-server directly: never a pass, issue 40); the digest
    alone says nothing of which image it is, so it mentions a server and is not understood."""
    code, out = _check(world, tmp_path, capsys, _service(f"{TAGGED}@{DIGEST}"))
    assert_covered_raw(code, out)
    assert "not a llama-server service" not in out
    assert "mentions a server but is not a server service" in _refused(
        tmp_path, _service(f"ghcr.io/ggml-org/llama.cpp@{DIGEST}")
    )
    assert "image digest sha256:abc" in _refused(tmp_path, _service(f"{TAGGED}@sha256:abc"))


def test_the_documented_serve_service_passes_with_limits_health_and_logging(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    """docs/deploy.md's service, with health checks, logging and limits, passes where the gate
    names its digest; a volume over the image's programs, or an env_file, does not."""
    engine = f"/app/llama-server, -m, /models/{MODEL}.gguf, {OK_FLAGS.replace(' ', ', ')}"
    body = (
        f"services:\n  llm:\n    image: registry.example/llm/serve:b1@{DIGEST}\n"
        "    entrypoint: [/usr/local/bin/batch-invariance, serve]\n"
        f"    command: [--certs, /certs, --allow-unsigned, --, {engine}]\n"
        "    volumes: ['./models:/models:ro', './certs:/certs:ro']\n"
        "    ports: ['8080:8080']\n    restart: unless-stopped\n    init: true\n"
        "    healthcheck: {test: [CMD, curl, -f, 'http://localhost:8080/health'], interval: 30s}\n"
        "    logging: {driver: json-file, options: {max-size: 10m}}\n"
        "    ulimits: {nofile: 65536}\n    mem_limit: 8g\n"
        "    deploy: {resources: {limits: {cpus: '4'}}}\n"
    )
    pinned = ("--serve-image", DIGEST)
    for text, extra, named in [
        (body, pinned, "check-deploy: PASS"),
        (body, (), "whose digest the gate does not name"),
        (body.replace("'./certs:/certs:ro'", "'./x:/usr/lib/python3'"), pinned,
         "volume at /usr/lib/python3"),
        (body + "    env_file: ./llm.env\n", pinned, "key env_file of a server service"),
    ]:  # fmt: skip
        code, out = _check(world, tmp_path, capsys, text, *extra)
        assert named in out and (code == exitcodes.PROMOTABLE) == ("PASS" in named), out


def test_image_references_split_as_docker_splits_them() -> None:
    local = "localhost:5000/llama.cpp"
    assert image_tag(TAGGED) == ("ghcr.io/ggml-org/llama.cpp", "server", "")
    assert image_tag(f"{TAGGED}-cuda@{DIGEST}") == ("ghcr.io/ggml-org/llama.cpp", "server-cuda",
                                                   DIGEST)  # fmt: skip
    assert image_tag(f"{local}@{DIGEST}") == (local, "", DIGEST)
    assert image_tag(local) == (local, "", "")


@pytest.mark.parametrize(
    ("entrypoint", "mount", "named"),
    [
        ("", "./mybin:/app/llama-server", "/app/llama-server, on, above or below /app"),
        ("", "./x:/app", "/app, on, above or below /app"),
        ("", "./x:/", "/, on, above or below /app"),
        ("", "./x:/app/models", "/app/models, on, above or below /app"),
        ("", "./x:/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu, on, above or below /usr"),
        ("", "./x:/etc", "/etc, on, above or below /etc"),
        ("", "./x:/etc/ld.so.preload", "/etc/ld.so.preload, on, above or below /etc"),
        ("/srv/llama/bin/llama-server", "./b:/srv", "/srv, on, above or below /srv/llama/bin"),
        ("/srv/llama/bin/llama-server", "./b:/srv/data", None),
    ],
)  # fmt: skip
def test_a_mount_over_what_the_image_runs_is_not_understood(
    tmp_path: Path, entrypoint: str, mount: str, named: str | None
) -> None:
    extra = f"    entrypoint: [{entrypoint}]\n" if entrypoint else ""
    body = _service(volumes=f"'./models:/models:ro', '{mount}'", extra=extra)
    found = read(tmp_path / "compose.yaml", body).unmodelled
    said = [f.split(" (it replaces")[0] for f in found]
    assert said == [f"compose.yaml:4: not understood: [llm] volume at {named}"] * bool(named), found


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ("    labels: {a: &x b, c: *x}\n", "6: not understood: a YAML anchor or alias"),
        ("    labels: !!map {a: b}\n", "6: not understood: a YAML tag"),
        ("    labels: {<<: {a: b}}\n", "6: not understood: a YAML merge key"),
        ("    labels:\n      a: |\n        b\n", "7: not understood: a YAML block scalar"),
        ("    labels: {a: b, a: c}\n", "6: not understood: key a given twice"),
        ("    labels: {a: yes}\n", "6: not understood: plain YAML value 'yes' (quote it)"),
        ("    labels: {a: 0x1F}\n", "plain YAML value '0x1F'"),
        ("    labels: {a: 012}\n", "plain YAML value '012'"),
        ("    labels: {a: 1.5}\n", "plain YAML value '1.5'"),
        ("    labels: {a: ~}\n", "plain YAML value '~'"),
        ("    environment: {LLAMA_ARG_FLASH_ATTN: true}\n", "(quote it)"),
        ("    entrypoint: [llama-server, --no-mmap, true]\n", "(quote it)"),
        ("---\nservices: {}\n", "6: not understood: not valid YAML (but found another"),
    ],
)  # fmt: skip
def test_yaml_outside_what_both_readers_read_alike_is_not_understood(
    tmp_path: Path, extra: str, named: str
) -> None:
    """What PyYAML (YAML 1.1) and compose's Go reader (YAML 1.2) read otherwise, or only one
    expands, is refused at its line."""
    assert named in _refused(tmp_path, _service(extra=extra))


def test_a_dot_env_that_changes_what_compose_reads_is_not_understood(tmp_path: Path) -> None:
    """``COMPOSE_FILE`` in ``.env`` makes compose read another file; other lines only feed
    interpolation, which no ``$`` in the file uses."""
    (tmp_path / ".env").write_text("TAG=x\n")
    assert read(tmp_path / "compose.yaml", _service()).unmodelled == ()
    (tmp_path / ".env").write_text("TAG=x\nexport COMPOSE_FILE=other.yml\n")
    assert ".env:2: not understood: COMPOSE_* or DOCKER_*" in _refused(tmp_path, _service())
    found = read(tmp_path / "compose.yaml", _service(f"{TAGGED}$X")).unmodelled
    assert "compose.yaml:3: not understood: a $ (compose interpolates it" in found[-1]


def test_files_are_picked_and_merged_in_composes_order(tmp_path: Path) -> None:
    # compose-go's order: compose.yaml, compose.yml, docker-compose.yml, docker-compose.yaml.
    assert DEFAULT_FILES == ("compose.yaml", "compose.yml", "docker-compose.yml",
                             "docker-compose.yaml")  # fmt: skip
    for name in DEFAULT_FILES:
        (tmp_path / name).write_text("services: {}\n")
    for k, name in enumerate(DEFAULT_FILES):
        found = project_problems(tmp_path / name)
        assert [p.file for p in found] == [n for n in DEFAULT_FILES if n != name]
        # The first present name is what `docker compose` reads; any other is a second file.
        assert ("reads instead of" in found[0].construct) == (k > 0), (name, found[0])
        assert ("compose.yaml" if k else "compose.yml") in found[0].construct
    # Given another name (run with -f), only the default names beside it count; an override
    # file is merged only into a default-named file.
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "compose.override.yml").write_text("services: {}\n")
    assert project_problems(alone / "llm.yaml") == []
    assert "is an override file" in project_problems(alone / "compose.override.yml")[0].construct
    # The same file under two names (a symlink) is one file.
    (alone / "compose.yaml").write_text("services: {}\n")
    (alone / "docker-compose.yml").symlink_to(alone / "compose.yaml")
    assert [p.file for p in project_problems(alone / "compose.yaml")] == ["compose.override.yml"]
    for override in OVERRIDES:  # each override file compose would merge is named
        (alone / "compose.override.yml").unlink(missing_ok=True)
        (alone / override).write_text("services: {}\n")
        (problem,) = project_problems(alone / "compose.yaml")
        assert problem.construct.startswith(f"override file {override}"), problem
        (alone / override).unlink()


@pytest.mark.parametrize(
    ("flags", "extra", "named"),
    [
        (OK_FLAGS.replace("-np 4", "-np 04"), "", "-np needs an integer"),
        (OK_FLAGS, "    environment:\n      LLAMA_ARG_UBATCH: '01'\n",
         "LLAMA_ARG_UBATCH needs an integer"),
    ],
)  # fmt: skip
def test_a_number_the_server_could_read_otherwise_never_covered(
    world: World, tmp_path: Path, capsys: Capsys, flags: str, extra: str, named: str
) -> None:
    """Compose hands the command's words to llama-server as they are: a form std::stoi reads
    otherwise than the gate is refused, naming the option (never a PASS)."""
    code, out = _check(world, tmp_path, capsys, _service(extra=extra).replace(OK_FLAGS, flags))
    assert code != exitcodes.PROMOTABLE and "check-deploy: PASS" not in out and named in out
