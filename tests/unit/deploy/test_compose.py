"""A compose project as `docker compose` runs it (issue 32): the files it picks in a folder and
merges, bind mounts over what the image runs, a digest-pinned image, and ``env_file``
refused.

The passes end to end through the CLI against the promotable GREEN of ``test_check_deploy.py``'s
``world`` (ctx 1024, N 4, split, ``-ub 1``), with ``--server-binary`` naming the file the image
runs: the documented serve service passes, the measured raw service's cell is covered (never a
pass: issue 40). Each way compose could run something else is refused by the reader at its
line (what the CLI prints of a refusal is test_closed.py's).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from batch_invariance.deploy.readers.compose import (
    DEFAULT_FILES,
    OVERRIDES,
    compose_commands,
    project_problems,
)
from batch_invariance.deploy.readers.compose_service import image_tag
from tests.unit.deploy.test_check_deploy import (  # noqa: F401 (the fixture)
    MODEL,
    OK_FLAGS,
    assert_covered_raw,
    world,
)

DIGEST = "sha256:" + "0123456789abcdef" * 4
TAGGED = "ghcr.io/ggml-org/llama.cpp:server"


def _service(image: str = TAGGED, extra: str = "", volumes: str = "'./models:/models:ro'") -> str:
    return (
        f"services:\n  llm:\n    image: {image}\n    volumes: [{volumes}]\n"
        f"    command: -m /models/{MODEL}.gguf {OK_FLAGS}\n{extra}"
    )


def _check(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    body: str,
    *,
    name: str = "compose.yaml",
) -> int:
    folder = tmp_path / "deploy"
    folder.mkdir(exist_ok=True)
    if not (folder / "models").exists():
        (folder / "models").symlink_to(world["model"].parent)
    config = folder / name
    config.write_text(body)
    return main(["check-deploy", str(config), "--certs", str(world["certs"]), "--allow-unsigned",
                 "--server-binary", str(world["binary"])])  # fmt: skip


def _covered(world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
             body: str, **kw: object) -> str:  # fmt: skip
    """The project's cell is covered by the cert; the image starts llama-server directly, so
    the project is never a pass (issue 40)."""
    code = _check(world, tmp_path, body, **kw)  # type: ignore[arg-type]
    out = capsys.readouterr()
    assert_covered_raw(code, out.out + out.err)
    return out.out


def _refused(tmp_path: Path, body: str) -> str:
    found = compose_commands(tmp_path / "compose.yaml", body).unmodelled
    assert found, body
    return found[0]


# --------------------------------------------------------------------------- the image


def test_a_digest_pinned_server_image_is_the_server_image(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _covered(world, tmp_path, capsys, _service(f"{TAGGED}@{DIGEST}"))
    assert "not a llama-server service" not in out
    # The digest alone says nothing of which image it is: it mentions a server, so it is
    # not understood (never silently skipped).
    assert "mentions a server but is not a server service" in _refused(
        tmp_path, _service(f"ghcr.io/ggml-org/llama.cpp@{DIGEST}")
    )
    assert "image digest sha256:abc" in _refused(tmp_path, _service(f"{TAGGED}@sha256:abc"))


def test_the_documented_serve_service_passes_with_limits_health_and_logging(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/deploy.md's compose service (serve in an image pinned by digest) with health
    checks, logging and resource limits passes where the gate names the digest; a volume over
    the image's programs, or an env_file, does not."""
    engine = f"/app/llama-server, -m, /models/{MODEL}.gguf, {OK_FLAGS.replace(' ', ', ')}"
    body = (
        f"services:\n  llm:\n    image: registry.example/llm/serve:b1@{DIGEST}\n"
        "    entrypoint: [/usr/local/bin/batch-invariance, serve]\n"
        f"    command: [--certs, /certs, --allow-unsigned, --, {engine}]\n"
        "    volumes: ['./models:/models:ro', './certs:/certs:ro']\n"
        "    ports: ['8080:8080']\n    restart: unless-stopped\n    init: true\n"
        "    healthcheck: {test: [CMD, curl, -f, 'http://localhost:8080/health'], "
        "interval: 30s}\n"
        "    logging: {driver: json-file, options: {max-size: 10m}}\n"
        "    ulimits: {nofile: 65536}\n    mem_limit: 8g\n"
        "    deploy: {resources: {limits: {cpus: '4'}}}\n"
    )
    serve_image = ["--serve-image", DIGEST]
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "models").symlink_to(world["model"].parent)
    config = folder / "compose.yaml"
    args = ["check-deploy", str(config), "--certs", str(world["certs"]), "--allow-unsigned",
            "--server-binary", str(world["binary"])]  # fmt: skip
    for text, extra, named in [
        (body, serve_image, "check-deploy: PASS"),
        (body, [], "whose digest the gate does not name"),
        (body.replace("'./certs:/certs:ro'", "'./x:/usr/lib/python3'"), serve_image,
         "volume at /usr/lib/python3"),
        (body + "    env_file: ./llm.env\n", serve_image, "key env_file of a server service"),
    ]:  # fmt: skip
        config.write_text(text)
        code = main([*args, *extra])
        out = capsys.readouterr().out
        assert named in out and (code == exitcodes.PROMOTABLE) == ("PASS" in named), out


def test_image_references_split_as_docker_splits_them() -> None:
    assert image_tag(TAGGED) == ("ghcr.io/ggml-org/llama.cpp", "server", "")
    assert image_tag(f"{TAGGED}-cuda@{DIGEST}") == ("ghcr.io/ggml-org/llama.cpp", "server-cuda",
                                                   DIGEST)  # fmt: skip
    assert image_tag(f"localhost:5000/llama.cpp@{DIGEST}") == ("localhost:5000/llama.cpp", "",
                                                               DIGEST)  # fmt: skip
    assert image_tag("localhost:5000/llama.cpp") == ("localhost:5000/llama.cpp", "", "")


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
    found = compose_commands(tmp_path / "compose.yaml", body).unmodelled
    expected = (
        () if named is None else (f"compose.yaml:4: not understood: [llm] volume at {named}",)
    )
    assert tuple(f.split(" (it replaces")[0] for f in found) == expected, found


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
    """PyYAML (YAML 1.1) and compose's Go reader (YAML 1.2) read the same text otherwise:
    what only one reads as text, a boolean where compose wants text, or a construct only one
    expands, is refused at its line."""
    found = compose_commands(tmp_path / "compose.yaml", _service(extra=extra)).unmodelled
    assert found and named in found[0], found


# --------------------------------------------------------------------------- the files


def test_a_dot_env_that_changes_what_compose_reads_is_not_understood(tmp_path: Path) -> None:
    """``COMPOSE_FILE`` in ``.env`` makes compose read another file; other lines only feed
    interpolation, which no ``$`` in the file uses."""
    (tmp_path / ".env").write_text("TAG=x\n")
    assert compose_commands(tmp_path / "compose.yaml", _service()).unmodelled == ()
    (tmp_path / ".env").write_text("TAG=x\nexport COMPOSE_FILE=other.yml\n")
    assert ".env:2: not understood: COMPOSE_* or DOCKER_*" in _refused(tmp_path, _service())
    found = compose_commands(tmp_path / "compose.yaml", _service(f"{TAGGED}$X")).unmodelled
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
        winner = "compose.yaml" if k else "compose.yml"
        assert ("reads instead of" in found[0].construct) == (k > 0), (name, found[0])
        assert winner in found[0].construct
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
    # Each override file compose would merge is named.
    for override in OVERRIDES:
        (alone / "compose.override.yml").unlink(missing_ok=True)
        (alone / override).write_text("services: {}\n")
        (found,) = project_problems(alone / "compose.yaml")
        assert found.construct.startswith(f"override file {override}"), found
        (alone / override).unlink()


# --------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("flags", "extra", "named"),
    [
        (OK_FLAGS.replace("-np 4", "-np 04"), "", "-np needs an integer"),
        (OK_FLAGS, "    environment:\n      LLAMA_ARG_UBATCH: '01'\n",
         "LLAMA_ARG_UBATCH needs an integer"),
    ],
)  # fmt: skip
def test_a_number_the_server_could_read_otherwise_never_covered(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: str,
    extra: str,
    named: str,
) -> None:
    """Compose hands the command's words and values to llama-server as they are: a form
    std::stoi reads otherwise than the gate is refused, naming the option (never a PASS)."""
    body = _service(extra=extra).replace(OK_FLAGS, flags)
    code = _check(world, tmp_path, body)
    out = capsys.readouterr()
    assert code != exitcodes.PROMOTABLE and "check-deploy: PASS" not in out.out
    assert named in out.out + out.err
