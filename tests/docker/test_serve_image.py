"""The serve image for real: docker/serve.Dockerfile built on llama.cpp's server image, run as
the compose service docs/deploy.md ("Containers: the serve image") tells a deploy to write.

The official image (``ghcr.io/ggml-org/llama.cpp:server``) cannot be pulled here, so a stand-in
is built as it is laid out: the stage's Debian base (``BI_BASE_IMAGE``), ``libgomp1`` and
``curl``, the provisioned llama-server (and any llama.cpp library beside it) in ``/app``,
``LLAMA_ARG_HOST=0.0.0.0``, working folder ``/app``, entrypoint ``/app/llama-server``. The
serve image is then built from docker/serve.Dockerfile with ``LLAMA_IMAGE`` naming it.

Checked: the server binary and every library it loads are the stand-in's bytes; check-deploy
passes the documented compose service (the image pinned by a digest ``--serve-image`` names);
that service, run on this engine (its entrypoint, command, read-only bind mounts and port, as
compose would start it: no compose CLI here), serves the measured cell (4 slots of 1024
tokens) from a cert recorded for the provisioned binary and model; the same service at
``-np 8`` exits 3 before any server starts. Containers and images are removed even on failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from batch_invariance import exitcodes
from batch_invariance.provision.embedded import provision
from tests.support.paths import REPO

#: The stand-in for llama.cpp's official CPU server image (its .devops/cpu.Dockerfile
#: ``server`` stage: the same packages, paths, variable, health check and entrypoint).
STAND_IN = """\
FROM {base}
RUN apt-get update \\
    && apt-get install -y --no-install-recommends libgomp1 curl \\
    && rm -rf /var/lib/apt/lists/*
COPY app/ /app/
ENV LLAMA_ARG_HOST=0.0.0.0
WORKDIR /app
HEALTHCHECK CMD [ "curl", "-f", "http://localhost:8080/health" ]
ENTRYPOINT [ "/app/llama-server" ]
"""

#: sha256 of every file in /app and of every library ldd resolves for the server binary.
SERVED_FILES = (
    "{ find /app -type f; ldd /app/llama-server | awk "
    "'$2 == \"=>\" && $3 ~ /^\\// { print $3 } $1 ~ /^\\// { print $1 }'; } "
    "| sort -u | xargs -d '\\n' sha256sum"
)

#: The compose service docs/deploy.md documents ({image}, {model}, {np} filled in).
COMPOSE = """\
services:
  llm:
    image: {image}
    entrypoint: [/usr/local/bin/batch-invariance, serve]
    command: ['--certs', /certs, '--allow-unsigned', '--', /app/llama-server,
              -m, /models/{model}, -c, '4096', -np, '{np}', -ub, '1', '--no-cache-prompt',
              '--cache-ram', '0', '--host', '0.0.0.0', '--port', '8080']
    volumes: ['./models:/models:ro', './certs:/certs:ro']
    ports: ['127.0.0.1:{port}:8080']
"""


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _built(args: list[str], what: str) -> float:
    started = time.monotonic()
    proc = _docker("build", "--force-rm", *args, timeout=1800)
    assert proc.returncode == 0, f"{what}: " + proc.stdout[-3000:] + proc.stderr[-3000:]
    return time.monotonic() - started


@dataclass(frozen=True)
class Images:
    stand_in: str
    serve: str
    serve_id: str  # sha256:<64 hex>
    server_bin: Path  # the host build the stand-in holds
    model: Path


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Images]:
    """The stand-in official image and the serve image built on it; both removed after."""
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode
    ):
        pytest.skip("no Docker engine answers `docker info`: .ci/docker-stage starts one")
    base = os.environ.get("BI_BASE_IMAGE")
    if not base:
        pytest.skip("no BI_BASE_IMAGE for the stand-in server image (.ci/docker-stage builds one)")
    pair = provision()  # reuses the cache the suite filled
    server_bin = Path(os.environ.get("BI_LIVE_SERVER_BIN") or pair.server_bin)
    context = tmp_path_factory.mktemp("stand-in")
    app = context / "app"
    app.mkdir()
    # The build and the llama.cpp libraries beside it (a portable build may load them), as the
    # official image keeps them in /app.
    for path in [server_bin, *server_bin.parent.glob("lib*.so*")]:
        shutil.copy2(path, app / ("llama-server" if path == server_bin else path.name))
    (context / "Dockerfile").write_text(STAND_IN.format(base=base))
    run = uuid.uuid4().hex[:12]
    stand_in, serve = f"bi-llama-standin:{run}", f"bi-serve:{run}"
    network = os.environ.get("BI_BUILD_NETWORK")
    net = ["--network", network] if network else []
    try:
        took = _built([*net, "-t", stand_in, str(context)], "the stand-in image")
        print(f"\nstand-in official image built in {took:.1f} s")
        took = _built(
            [*net, "-f", str(REPO / "docker" / "serve.Dockerfile"),
             "--build-arg", f"LLAMA_IMAGE={stand_in}", "-t", serve, str(REPO)],
            "docker/serve.Dockerfile",
        )  # fmt: skip
        print(f"serve image built in {took:.1f} s")
        serve_id = _docker("image", "inspect", "--format", "{{.Id}}", serve).stdout.strip()
        assert serve_id.startswith("sha256:") and len(serve_id) == 71, serve_id
        yield Images(stand_in, serve, serve_id, server_bin, pair.model)
    finally:
        _docker("image", "rm", "-f", serve, stand_in)


def _served(image: str) -> str:
    proc = _docker("run", "--rm", "--entrypoint", "/bin/sh", image, "-c", SERVED_FILES)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_the_serve_image_keeps_the_official_server_bytes(images: Images) -> None:
    before, after = _served(images.stand_in), _served(images.serve)
    assert "/app/llama-server" in before and "libc.so.6" in before and "libgomp" in before
    assert after == before, "the serve image changed a file the server runs or loads"
    host = subprocess.run(["sha256sum", str(images.server_bin)], capture_output=True, text=True)
    want = host.stdout.split()[0]
    assert f"{want}  /app/llama-server" in after
    entrypoint = _docker("image", "inspect", "--format", "{{json .Config.Entrypoint}}",
                         images.serve).stdout.strip()  # fmt: skip
    assert entrypoint == '["/usr/local/bin/batch-invariance","serve"]'
    print(f"\n/app and the libraries /app/llama-server loads, unchanged:\n{after}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Deploy:
    root: Path
    compose: Path
    certs: Path
    model: Path


@pytest.fixture
def deploy(images: Images, tmp_path: Path) -> Deploy:
    """A deploy folder: compose.yaml beside models/ and certs/ (0755: serve refuses a cert in
    a folder others can write), the cert recorded for the provisioned binary and model."""
    from tests.support.deploy_world import _live_cert, _provenance

    root = tmp_path / "deploy"
    models, certs = root / "models", root / "certs"
    for folder in (root, models, certs):
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)
    model = models / images.model.name
    shutil.copy2(images.model, model)
    model.chmod(0o644)
    provenance = _provenance(model, 4, "split", binary=images.server_bin)
    for server in provenance["servers"]:
        server["argv"][0] = str(images.server_bin)
    cert = _live_cert(certs, model, provenance=provenance)
    assert cert.parent == certs
    return Deploy(root, root / "compose.yaml", certs, model)


def _write_compose(deploy: Deploy, images: Images, np: int, port: int) -> dict[str, object]:
    image = f"{images.serve}@{images.serve_id}"
    text = COMPOSE.format(image=image, model=deploy.model.name, np=np, port=port)
    deploy.compose.write_text(text)
    service = yaml.safe_load(text)["services"]["llm"]
    assert isinstance(service, dict)
    return service


def _check_deploy(
    deploy: Deploy, server_bin: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batch_invariance", "check-deploy", str(deploy.compose),
         "--certs", str(deploy.certs), "--allow-unsigned", "--server-binary", str(server_bin),
         *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _run_args(service: dict[str, object], deploy: Deploy, image: str, name: str) -> list[str]:
    """``docker run`` of the compose service as compose starts it (entrypoint, command,
    volumes relative to the compose file, ports), by the local tag: an image that was never
    pushed has no registry digest to be pulled by."""
    entrypoint, command = service["entrypoint"], service["command"]
    assert isinstance(entrypoint, list) and isinstance(command, list)
    args = ["run", "--name", name, "--entrypoint", str(entrypoint[0])]
    for volume in service["volumes"]:  # type: ignore[attr-defined]
        host, _, rest = str(volume).partition(":")
        args += ["-v", f"{(deploy.root / host).resolve()}:{rest}"]
    for port in service["ports"]:  # type: ignore[attr-defined]
        args += ["-p", str(port)]
    return [*args, image, *map(str, entrypoint[1:]), *map(str, command)]


def _wait_health(name: str, url: str, deadline_s: float = 240.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        state = _docker("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name)
        if state.stdout.split()[:1] != ["true"]:
            logs = _docker("logs", name)
            raise AssertionError(f"the container stopped ({state.stdout.strip()}): "
                                 + (logs.stdout + logs.stderr)[-3000:])  # fmt: skip
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return time.monotonic() - started
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise AssertionError("the served llama-server did not come up in the container")


def test_the_compose_service_serves_the_measured_cell_and_refuses_another(
    images: Images, deploy: Deploy
) -> None:
    port = _free_port()
    service = _write_compose(deploy, images, 4, port)
    # The gate: the documented service passes only with the image's digest named.
    gate = _check_deploy(deploy, images.server_bin, "--serve-image", images.serve_id)
    assert gate.returncode == exitcodes.PROMOTABLE, gate.stdout[-3000:] + gate.stderr[-2000:]
    unnamed = _check_deploy(deploy, images.server_bin)
    assert unnamed.returncode == exitcodes.NOT_PROMOTABLE, unnamed.stdout[-3000:]
    assert "whose digest the gate does not name" in unnamed.stdout
    name = f"bi-serve-{uuid.uuid4().hex[:12]}"
    try:
        started = _docker("run", "-d", *_run_args(service, deploy, images.serve, name)[1:])
        assert started.returncode == 0, started.stderr[-2000:]
        url = f"http://127.0.0.1:{port}"
        ready_s = _wait_health(name, url)
        body = requests.get(url + "/props", timeout=10).json()
        assert body["total_slots"] == 4
        assert body["default_generation_settings"]["n_ctx"] == 1024
        reply = requests.post(
            url + "/completion",
            json={"prompt": "The capital of France is", "n_predict": 8, "temperature": 0,
                  "cache_prompt": False, "return_tokens": True},
            timeout=120,
        )  # fmt: skip
        reply.raise_for_status()
        tokens = reply.json()["tokens"]
        assert len(tokens) > 0
        # serve became the server (PID 1 of the container): the image's /app/llama-server,
        # in /, the model as its descriptor, argv[0] the path the cert measured.
        exe = _docker("exec", name, "readlink", "/proc/1/exe", "/proc/1/cwd").stdout.split()
        assert exe == ["/app/llama-server", "/"], exe
        argv = _docker("exec", name, "cat", "/proc/1/cmdline").stdout.split("\0")
        assert argv[0] == str(images.server_bin), argv
        assert argv[argv.index("--model") + 1].startswith("/proc/self/fd/"), argv
        print(f"\nserve container healthy after {ready_s:.1f} s: 4 slots of 1024, "
              f"{len(tokens)} tokens answered")  # fmt: skip
    finally:
        _docker("rm", "-f", name)
    # The one-word change no cert measured: refused at start, before any server starts.
    raised = _write_compose(deploy, images, 8, _free_port())
    assert _check_deploy(deploy, images.server_bin, "--serve-image", images.serve_id).returncode
    refused = f"bi-serve-{uuid.uuid4().hex[:12]}"
    try:
        done = _docker(*_run_args(raised, deploy, images.serve, refused), timeout=300)
        said = done.stdout + done.stderr
        assert done.returncode == exitcodes.NOT_PROMOTABLE, said[-3000:]
        assert "no cert in /certs" in said and "N=8" in said, said[-3000:]
        assert "load_model" not in said and "llama_model_loader" not in said, said[-3000:]
        print(f"-np 8 refused: exit {done.returncode}: {said.strip().splitlines()[-1][:300]}")
    finally:
        _docker("rm", "-f", refused)
