"""Kubernetes manifests and rendered Helm output (issue 40): only a serve container in an image
pinned by a digest the gate names, asking for a measured cell, passes (the model on hostPath)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.deploy.readers.kubernetes import is_manifest, kubernetes_commands
from tests.support.deploy_world import MODEL, OK_FLAGS, Capsys, World, gate

DIGEST = "sha256:" + "0123456789abcdef" * 4
IMAGE = f"registry.example/llm-serve:1@{DIGEST}"
SERVE = "'/usr/local/bin/batch-invariance', 'serve', '--certs', '/certs', '--allow-unsigned', '--'"
NO = exitcodes.NOT_PROMOTABLE
WORDS = ["/app/llama-server", "-m", f"/models/{MODEL}.gguf", *OK_FLAGS.split(), "--port", "8080"]
ENGINE = ", ".join(f"'{w}'" for w in WORDS)


def _deployment(
    world: World, *, image: str = IMAGE, command: str = "", container: str = "", pod: str = "",
    mount: str = "/models",
) -> str:  # fmt: skip
    return f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: llm}}
spec:
  replicas: 1
  template:
    spec:
{pod}      volumes: [{{name: models, hostPath: {{path: '{world["model"].parent}'}}}}]
      containers:
      - name: serve
        image: '{image}'
        command: {command or f"[{SERVE}, {ENGINE}]"}
        resources: {{limits: {{memory: 4Gi}}}}
        readinessProbe: {{httpGet: {{path: /health, port: 8080}}}}
        volumeMounts: [{{name: models, mountPath: '{mount}', readOnly: true}}]
{container}"""


def _check(world: World, tmp_path: Path, capsys: Capsys, body: str, *extra: str) -> tuple[int, str]:
    (tmp_path / "llm.yaml").write_text(body)
    binary = str(world["binary"])
    code = gate(tmp_path / "llm.yaml", world["certs"], "--server-binary", binary, *extra)
    return code, capsys.readouterr().out


def test_a_serve_container_in_a_named_image_passes_and_nothing_else_does(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    body, pinned = _deployment(world), ("--serve-image", DIGEST)
    assert is_manifest(body)
    code, out = _check(world, tmp_path, capsys, body, *pinned)
    assert code == exitcodes.PROMOTABLE and "PASS" in out, out
    # The gate naming no image (or another one): not a pass.
    code, out = _check(world, tmp_path, capsys, body)
    assert code == NO and "whose digest the gate does not name" in out
    assert _check(world, tmp_path, capsys, body, "--serve-image", "sha256:" + "f" * 64)[0] == NO
    # Raising --parallel is a one-word change the gate reads: no cert measured N 8.
    code, out = _check(world, tmp_path, capsys, body.replace("'-np', '4'", "'-np', '8'"), *pinned)
    assert code == NO and "N=8" in out
    # A container that starts llama-server directly: covered, never a pass.
    direct = _deployment(world, command=f"[{ENGINE}]")
    code, out = _check(world, tmp_path, capsys, direct, *pinned)
    assert code == NO and "directly, which is never a pass" in out and "covers this cell" in out
    assert "batch-invariance serve --certs" in out


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"image": "registry.example/llm-serve:1"}, "not pinned by digest"),
        ({"mount": "/usr/local"}, "on, above or below"),
        ({"mount": "/"}, "on, above or below"),
        ({"container": "        lifecycle: {postStart: {exec: {command: ['true']}}}\n"},
         "lifecycle hooks"),
        ({"pod": "      shareProcessNamespace: true\n"}, "shareProcessNamespace"),
        ({"command": f"[{SERVE}, '/app/llama-server', '-m', '$(MODEL)']"}, "kubelet expands"),
        ({"container": "        env: [{name: X, valueFrom: {fieldRef: {fieldPath: a}}}]\n"},
         "valueFrom"),
        ({"container": "      - name: side\n        image: busybox\n        command: ['sh', "
                       "'-c', 'llama-server -m /models/x.gguf -np 8']\n"}, "mentions a server"),
    ],
)  # fmt: skip
def test_what_could_start_or_change_something_else_is_not_understood(
    world: World, tmp_path: Path, capsys: Capsys, change: dict[str, str], named: str
) -> None:
    body = _deployment(world, **change)
    code, out = _check(world, tmp_path, capsys, body, "--serve-image", DIGEST)
    assert code == NO and named in out and "PASS" not in out, out


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
