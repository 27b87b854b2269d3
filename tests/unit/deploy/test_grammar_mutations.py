"""Units and compose files built from their grammars, mutated with a construct outside them:
every mutation is refused, naming the file and the line (hypothesis)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batch_invariance.deploy.readers.config import read_deploy_file
from tests.unit.deploy.test_systemd_real import units

UNIT_MUTATIONS = (
    "ExecStartPre=/usr/bin/curl -o /srv/m.gguf https://example.com/m",
    "ExecStartPost=/bin/true", "PassEnvironment=LLAMA_ARG_UBATCH", "RootDirectory=/srv/root",
    "BindReadOnlyPaths=/srv/other:/srv", "Environment=X=%h", "Environment=X=$HOME",
    "Environment=K=a#b", "Environment='K=1'", "UnsetEnvironment=K=1", "DynamicUser=yes",
    "WorkingDirectory=~", "WorkingDirectory=-/srv", "EnvironmentFile=relative.env",
    "Type=forking", "StandardOutput=file:/srv/m.gguf", "ExecStart=/bin/sh -c 'llama-server'",
    "LoadCredential=k:/etc/k", "CPUAffinity=0-3", "Nice=-5 \\", "[Socket]",
    "no equals sign here", "Environment=A=1 \\\n# a comment inside",
)  # fmt: skip


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=units(), mutation=st.sampled_from(UNIT_MUTATIONS), data=st.data())
def test_every_unit_mutation_is_refused_with_its_line(
    tmp_path: Path, text: str, mutation: str, data: st.DataObject
) -> None:
    lines = text.splitlines()
    service = lines.index("[Service]")
    at = data.draw(st.integers(service + 1, lines.index("[Install]")))
    mutated = [*lines[:at], mutation, *lines[at:]]
    unit = tmp_path / "llm.service"
    unit.write_text("\n".join(mutated) + "\n")
    found = read_deploy_file(unit).not_understood
    assert found, f"passed: {mutation!r}"
    named = at + 1 + mutation.count("\n")  # a comment in a continuation is its own line
    # A second ExecStart= is named with every ExecStart= line that remains.
    lines_named = (found[0].line, *([named] if f"llm.service:{named}" in str(found[0]) else []))
    assert found[0].file == "llm.service" and named in lines_named, (mutation, found[0])


COMPOSE = (
    "services:\n  llm:\n    image: ghcr.io/ggml-org/llama.cpp:server\n"
    "    volumes: ['./models:/models:ro']\n"
    "    command: [-m, /models/a.gguf, -c, '4096', -np, '4']\n"
    "    environment:\n      LLAMA_ARG_UBATCH: '1'\n    ports: ['8080:8080']\n"
    "    restart: unless-stopped\n"
)
COMPOSE_MUTATIONS = (
    "    extends: {file: base.yml, service: llm}", "    env_file: []\n    build: .",
    "    privileged: true", "    volumes_from: [other]", "    profiles: [gpu]",
    "    deploy: {resources: {}}", "    user: '1000'", "    tmpfs: [/tmp]",
    "    network_mode: host", "    ipc: host", "    x-note: hello", "    entrypoint: &e [sh]",
    "    labels: !!map {a: b}", "    working_dir: relative", "    stop_signal: ${SIG}",
    "    init: yes",
)  # fmt: skip


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mutation=st.sampled_from(COMPOSE_MUTATIONS), data=st.data())
def test_every_compose_mutation_is_refused_with_its_line(
    tmp_path: Path, mutation: str, data: st.DataObject
) -> None:
    lines = COMPOSE.splitlines()
    at = data.draw(st.sampled_from([3, 4, 5, 8, 9]))  # between the service's keys
    mutated = [*lines[:at], mutation, *lines[at:]]
    path = tmp_path / "compose.yaml"
    path.write_text("\n".join(mutated) + "\n")
    found = read_deploy_file(path).not_understood
    assert found, f"passed: {mutation!r}"
    named = at + 1 + mutation.count("\n")
    assert (found[0].file, found[0].line) == ("compose.yaml", named), (mutation, found[0])


def test_the_unmutated_files_pass(tmp_path: Path) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text(COMPOSE)
    assert read_deploy_file(path).not_understood == ()


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
