"""Kubernetes manifests (``kubectl apply -f``, rendered Helm output): the containers a workload
starts, read on an allowlist.

A YAML file whose documents all hold ``apiVersion`` and ``kind`` is a manifest. Each container
of a workload (:data:`POD_SPECS`) is read as compose's are
(:mod:`batch_invariance.deploy.readers.compose_service`): ``command`` + ``args``, ``env``
values, ``workingDir`` and ``hostPath`` mounts. Refused: what the cluster fills in
(``valueFrom``, ``envFrom``), kubelet's ``$(VAR)``, lifecycle hooks and a shared process
namespace around serve, any other container that mentions a server, and a document of any other
kind that holds ``containers`` and mentions a server (an operator's or controller's own
workload: a rollout, an inference service); other kinds (Service, ConfigMap ...) start nothing
and are not read.
"""

from __future__ import annotations

import re
from pathlib import Path
from posixpath import normpath
from typing import Any

from batch_invariance.deploy.readers.compose_service import (
    MOUNT_FIX,
    container_command,
    container_program,
    mentions_server,
    program_mount,
)
from batch_invariance.deploy.readers.compose_yaml import Refused, load, plain
from batch_invariance.deploy.readers.source_bytes import BUDGET_FIX, ServerBudget
from batch_invariance.gate.serve_line import is_serve
from batch_invariance.gate.server_command import (
    BindMount,
    DeployRead,
    NotUnderstood,
    ServerCommand,
)

_DOCUMENT = re.compile(r"^---[ \t]*$", re.MULTILINE)
#: Where each workload kind keeps its pod spec.
POD_SPECS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    **dict.fromkeys(("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"),
                    ("spec", "template", "spec")),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}  # fmt: skip
FIX = "run batch-invariance serve in an image pinned by digest (docs/deploy.md, Kubernetes)"


def _documents(text: str) -> list[tuple[int, str]]:
    """Each document's first line number and text (``---`` separator lines dropped)."""
    out: list[tuple[int, str]] = []
    start, line = 0, 1
    for match in _DOCUMENT.finditer(text):
        out.append((line, text[start : match.start()]))
        line += text[start : match.end()].count("\n")
        start = match.end()
    out.append((line, text[start:]))
    return [(n, body) for n, body in out if body.strip()]


def is_manifest(text: str) -> bool:
    """Every document holds top-level ``apiVersion:`` and ``kind:`` keys."""
    docs = _documents(text)
    return bool(docs) and all(
        re.search(r"^apiVersion:", body, re.M) and re.search(r"^kind:", body, re.M)
        for _, body in docs
    )


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key][0]
    return value


def _words(value: Any, key: str) -> list[str]:
    items = plain(value) if value is not None else []
    if not isinstance(items, list) or not all(isinstance(w, str) for w in items):
        raise Refused(0, f"{key} that is not a list of text", "write it as a list of strings")
    for word in items:
        if "$" in word:
            raise Refused(0, f"{key} word {word[:60]!r} (kubelet expands $(VAR))",
                          "write the value out")  # fmt: skip
    return list(items)


def _env(value: Any) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in plain(value) if value is not None else []:
        if not isinstance(item, dict) or set(item) != {"name", "value"}:
            raise Refused(0, "an env entry other than {name, value} (valueFrom is filled in "
                          "by the cluster)", "write the value out")  # fmt: skip
        env[str(item["name"])] = str(item["value"])
    return env


def _mounts(container: dict[str, Any], volumes: dict[str, str], program: str,
            serving: bool) -> list[BindMount]:  # fmt: skip
    out = []
    for item in plain(container.get("volumeMounts", ([], 0))[0]) or []:
        path = normpath(str(item.get("mountPath", "")))
        if not path.startswith("/") or "subPath" in item or "subPathExpr" in item:
            raise Refused(0, f"volumeMount {path} (relative, or with a subPath)")
        if serving and (problem := program_mount(path, program)) is not None:
            raise Refused(0, problem, MOUNT_FIX)
        # A volume that is no host folder: nothing under it is here.
        out.append(BindMount(path, volumes.get(str(item.get("name")), "")))
    return out


def _container(container: dict[str, Any], pod: dict[str, Any], volumes: dict[str, str],
               origin: str) -> ServerCommand | None:  # fmt: skip
    """The server one container starts, or ``None`` when it starts none."""
    command = _words(container.get("command", (None, 0))[0], "command")
    args = _words(container.get("args", (None, 0))[0], "args")
    image = str(plain(container.get("image", ("", 0))[0]) or "")
    program = container_program(command, image, 0)  # no command: the image's entrypoint
    if program is None:
        if mentions_server(container):
            raise Refused(0, "a container that mentions a server but starts none the reader "
                          "reads (no command, or another program)", FIX)  # fmt: skip
        return None
    argv = [*program, *args]
    serving = is_serve(argv)
    if serving and "lifecycle" in container:
        raise Refused(container["lifecycle"][1], "lifecycle hooks of a serve container (they "
                      "run beside the server and can change what it loads)")  # fmt: skip
    shared = pod.get("shareProcessNamespace", (None, 0))
    if serving and plain(shared[0]) not in (None, False, "false"):
        raise Refused(shared[1], "shareProcessNamespace around serve")
    mounts = _mounts(container, volumes, argv[0], serving)
    workdir = str(plain(container.get("workingDir", ("/", 0))[0]))
    if not workdir.startswith("/"):
        raise Refused(0, f"workingDir {workdir}")
    env = _env(container.get("env", (None, 0))[0])
    return container_command(origin, argv, env, workdir, [m for m in mounts if m.host], image)


def _workload(data: dict[str, Any], shown: str) -> list[ServerCommand]:
    kind = str(plain(data["kind"][0]))
    name = str(_get(data, "metadata", "name") or "?")
    pod = _get(data, *POD_SPECS[kind])
    if not isinstance(pod, dict):
        raise Refused(data["kind"][1], f"{kind} {name} without a pod spec")
    volumes = {
        str(v.get("name")): str(v["hostPath"].get("path", ""))
        for v in plain(pod.get("volumes", ([], 0))[0]) or []
        if isinstance(v, dict) and isinstance(v.get("hostPath"), dict)
    }
    out: list[ServerCommand] = []
    for key in ("initContainers", "containers"):
        for container in pod.get(key, ([], 0))[0] or []:
            cname = str(plain(container.get("name", ("?", 0))[0]))
            found = _container(container, pod, volumes, f"{shown} [{kind}/{name}/{cname}]")
            if found is not None:
                out.append(found)
    if "envFrom" in repr(plain(pod)):
        raise Refused(0, f"{kind} {name}: envFrom (filled in by the cluster)")
    return out


def kubernetes_commands(path: Path, text: str) -> DeployRead:
    """The servers the workloads of a manifest start, and what is off the allowlist."""
    shown = path.name
    commands: list[ServerCommand] = []
    bad: list[NotUnderstood] = []
    budget = ServerBudget()
    for first, body in _documents(text):
        data = load(body, shown, any_boolean=True)
        if isinstance(data, NotUnderstood):
            bad.append(NotUnderstood(shown, data.line + first - 1, data.construct, data.fix))
            continue
        kind = str(plain(data.get("kind", ("", 0))[0]))
        try:  # other kinds (Service, ConfigMap ...) start nothing: serve decides what runs
            if kind not in POD_SPECS and "'containers'" in repr(data) and mentions_server(data):
                raise Refused(1, f"a {kind or 'document'} with containers that mention a server "
                              "(not a workload kind the reader reads)")  # fmt: skip
            if kind in POD_SPECS:
                for command in _workload(data, shown):
                    if (crossed := budget.spend(command.argv, command.env)) is not None:
                        raise Refused(1, crossed, BUDGET_FIX)
                    commands.append(command)
        except Refused as exc:
            line = first + max(exc.line, 1) - 1
            bad.append(NotUnderstood(shown, line, exc.construct, exc.fix or FIX))
            if exc.fix == BUDGET_FIX:
                break
    return DeployRead(tuple(commands), tuple(bad))
