"""Kubernetes manifests and rendered Helm output (issue 40): check-deploy finds how a workload
starts ``batch-invariance serve`` and passes only a serve container in an image pinned by a
digest the gate names, whose line asks for a cell a promotable cert measured. A container that
starts llama-server directly is never a pass; anything that could start or change something
else is not understood.

End to end through the CLI against the promotable GREEN of ``test_check_deploy.py``'s ``world``
(ctx 1024, N 4, split, ``-ub 1``), the model on a ``hostPath`` volume, ``--server-binary``
naming the file the image runs (the early warning; serve proves it at start).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from batch_invariance.deploy.readers.kubernetes import is_manifest, kubernetes_commands
from tests.unit.deploy.test_check_deploy import MODEL, OK_FLAGS, world  # noqa: F401

DIGEST = "sha256:" + "0123456789abcdef" * 4
IMAGE = f"registry.example/llm-serve:1@{DIGEST}"


def _engine(flags: str = OK_FLAGS) -> str:
    words = ["/app/llama-server", "-m", f"/models/{MODEL}.gguf", *flags.split(),
             "--host", "0.0.0.0", "--port", "8080"]  # fmt: skip
    return ", ".join(f"'{w}'" for w in words)


def _deployment(
    world: dict[str, Path],  # noqa: F811
    *,
    image: str = IMAGE,
    command: str | None = None,
    container: str = "",
    pod: str = "",
    mount: str = "/models",
) -> str:
    command = command or (
        "['/usr/local/bin/batch-invariance', 'serve', '--certs', '/certs', '--allow-unsigned', "
        f"'--', {_engine()}]"
    )
    return f"""apiVersion: v1
kind: Service
metadata: {{name: llm}}
spec:
  ports: [{{port: 8080}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: llm}}
spec:
  replicas: 1
  template:
    spec:
{pod}      volumes:
      - name: models
        hostPath: {{path: '{world["model"].parent}'}}
      containers:
      - name: serve
        image: '{image}'
        command: {command}
        resources: {{limits: {{memory: 4Gi}}}}
        readinessProbe: {{httpGet: {{path: /health, port: 8080}}}}
        volumeMounts: [{{name: models, mountPath: '{mount}', readOnly: true}}]
{container}"""


def _check(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    body: str,
    *extra: str,
) -> int:
    config = tmp_path / "llm.yaml"
    config.write_text(body)
    return main(["check-deploy", str(config), "--certs", str(world["certs"]),
                 "--allow-unsigned", "--server-binary", str(world["binary"]), *extra])  # fmt: skip


def test_a_serve_container_in_a_named_image_passes_and_nothing_else_does(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    body = _deployment(world)
    assert is_manifest(body)
    assert _check(world, tmp_path, body, "--serve-image", DIGEST) == exitcodes.PROMOTABLE
    assert "PASS" in capsys.readouterr().out
    # The same manifest, the gate naming no image (or another one): not a pass.
    assert _check(world, tmp_path, body) == exitcodes.NOT_PROMOTABLE
    assert "whose digest the gate does not name" in capsys.readouterr().out
    other = "sha256:" + "f" * 64
    assert _check(world, tmp_path, body, "--serve-image", other) == exitcodes.NOT_PROMOTABLE
    # Raising --parallel is a one-word change the gate reads: no cert measured N 8.
    raised = body.replace("'-np', '4'", "'-np', '8'")
    assert _check(world, tmp_path, raised, "--serve-image", DIGEST) == exitcodes.NOT_PROMOTABLE
    assert "N=8" in capsys.readouterr().out


def test_a_container_that_starts_llama_server_is_never_a_pass(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    body = _deployment(world, command=f"[{_engine()}]")
    assert _check(world, tmp_path, body, "--serve-image", DIGEST) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert "directly, which is never a pass" in out and "covers this cell" in out
    assert "batch-invariance serve --certs" in out


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"image": "registry.example/llm-serve:1"}, "not pinned by digest"),
        ({"mount": "/usr/local"}, "on, above or below"),
        ({"mount": "/"}, "on, above or below"),
        (
            {"container": "        lifecycle: {postStart: {exec: {command: ['true']}}}\n"},
            "lifecycle hooks",
        ),
        ({"pod": "      shareProcessNamespace: true\n"}, "shareProcessNamespace"),
        (
            {
                "command": "['/usr/local/bin/batch-invariance', 'serve', '--certs', '/certs', "
                "'--allow-unsigned', '--', '/app/llama-server', '-m', '$(MODEL)']"
            },
            "kubelet expands",
        ),
        (
            {"container": "        env: [{name: X, valueFrom: {fieldRef: {fieldPath: a}}}]\n"},
            "valueFrom",
        ),
        (
            {
                "container": "      - name: side\n        image: busybox\n        command: ['sh', "
                "'-c', 'llama-server -m /models/x.gguf -np 8']\n"
            },
            "mentions a server",
        ),
    ],
)
def test_what_could_start_or_change_something_else_is_not_understood(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, str],
    named: str,
) -> None:
    body = _deployment(world, **change)
    assert _check(world, tmp_path, body, "--serve-image", DIGEST) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert named in out and "PASS" not in out


def test_a_rendered_helm_output_with_other_kinds_is_read(tmp_path: Path) -> None:
    body = (
        "# Source: llm/templates/configmap.yaml\napiVersion: v1\nkind: ConfigMap\n"
        "metadata: {name: cfg}\ndata: {note: 'llama-server reads nothing from here'}\n---\n"
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
        f"  - name: s\n    image: '{IMAGE}'\n    command: ['batch-invariance', 'serve', "
        "'--certs', '/c', '--', 'llama-server', '-m', '/m/a.gguf', '-np', '4']\n"
    )
    read = kubernetes_commands(tmp_path / "out.yaml", body)
    assert read.not_understood == ()
    (command,) = read.commands
    assert command.image == IMAGE and command.origin == "out.yaml [Pod/p/s]"
    assert command.argv[:2] == ("batch-invariance", "serve")
    assert not is_manifest("services:\n  llm: {image: x}\n")
    # A kind the reader does not read that holds containers naming a server (an Argo Rollout,
    # a KServe service) starts something else: refused; a Service named after one is not.
    service = "apiVersion: v1\nkind: Service\nmetadata: {name: llama-server}\n---\n"
    rollout = (
        "apiVersion: argoproj.io/v1alpha1\nkind: Rollout\nmetadata: {name: r}\nspec:\n"
        "  template: {spec: {containers: [{name: c, image: x, args: [llama-server, -np, '8']}]}}\n"
    )
    assert kubernetes_commands(tmp_path / "out.yaml", service + body).not_understood == ()
    (found,) = kubernetes_commands(tmp_path / "out.yaml", f"{body}---\n{rollout}").unmodelled
    assert found.startswith("out.yaml:15: not understood: a Rollout with containers that mention")
    listed = f"apiVersion: v1\nkind: List\nitems:\n- {rollout.replace(chr(10), chr(10) + '  ')}"
    (found,) = kubernetes_commands(tmp_path / "out.yaml", f"{body}---\n{listed}").unmodelled
    assert "a List with containers that mention a server" in found
