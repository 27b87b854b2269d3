"""Run act on a workflow of the scratch copy, offline, and read what it recorded.

act runs in host mode (``-P self-hosted=-self-hosted``: steps run as processes on this
machine, the action's container through the real Docker engine) with
``--action-offline-mode`` and every remote action resolved to a local folder
(``--local-repository``): the pinned actions/upload-artifact and actions/checkout copies, the
pinned actions/download-artifact built from its sources (tests/act/offline_actions.py), and
``addiplus/batch-invariance@v0`` (the reusable workflow) to the scratch copy itself. Its
artifact and cache servers listen on 127.0.0.1 only.

``--json`` makes act log one JSON object a line; :class:`ActRun` reads the job results, the
step outputs (``set-output``), the step summaries and the step errors from it. act runs in a
process group of its own, so a timeout or an interrupt ends every step process it started; the
action's containers (``bi-cell-*``) whose workspace lies under the scratch folder are removed
after every run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.act.offline_actions import DOWNLOAD_ARTIFACT
from tests.act.scratch import ORIGIN, Scratch

UPLOAD_ARTIFACT = "actions/upload-artifact@ea165f8d65b6e75b540449e92b4886f43607fa02"
CHECKOUT = "actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683"
#: A token for actions/checkout's required input; nothing reads it (the fetch is file://).
OFFLINE_TOKEN = "act-offline-no-github"
_STOP_GRACE_S = 60


@dataclass
class ActRun:
    """What one act run left: its exit code, its JSON log and the artifacts it stored."""

    returncode: int
    events: list[dict[str, Any]]
    artifacts: Path
    evidence: Path
    seconds: float
    text: str = field(repr=False, default="")

    def job_events(self, job: str) -> Iterator[dict[str, Any]]:
        """Events of the job named ``job`` (act's ``job`` field ends with the job's name)."""
        # act pads the names in its log to one width.
        return (e for e in self.events if str(e.get("job", "")).rstrip().endswith(job))

    def step_events(self, job: str, step: tuple[str, ...]) -> Iterator[dict[str, Any]]:
        """Events of one step: its id, and inside a composite action the path of ids."""
        return (e for e in self.job_events(job) if tuple(e.get("stepID", ())) == step)

    def job_results(self, job: str) -> list[str]:
        return [str(e["jobResult"]) for e in self.job_events(job) if "jobResult" in e]

    def outputs(self, job: str, *step: str) -> dict[str, str]:
        """The ``set-output`` values act recorded for that step."""
        return {
            str(e["name"]): str(e.get("arg", ""))
            for e in self.step_events(job, step)
            if e.get("command") == "set-output"
        }

    def exit_statuses(self, job: str, *step: str) -> list[str]:
        """act's ``exit status N`` errors for that step."""
        return [
            str(e["msg"])
            for e in self.step_events(job, step)
            if e.get("level") == "error" and str(e.get("msg", "")).startswith("exit status")
        ]

    def summary(self, job: str) -> str:
        """Every step summary (``$GITHUB_STEP_SUMMARY``) act collected for that job."""
        return "".join(
            str(e.get("content", "")) for e in self.job_events(job) if e.get("command") == "summary"
        )

    def job_seconds(self) -> dict[str, float]:
        """Each job's span, first to last event of it in act's log (the gate's timeline)."""
        spans: dict[str, tuple[datetime, datetime]] = {}
        for event in self.events:
            if "job" not in event or "time" not in event:
                continue
            at = datetime.fromisoformat(str(event["time"]).replace("Z", "+00:00"))
            first, last = spans.get(str(event["job"]).strip(), (at, at))
            spans[str(event["job"]).strip()] = (min(first, at), max(last, at))
        return {job: (last - first).total_seconds() for job, (first, last) in spans.items()}

    def lines(self, job: str) -> str:
        return "".join(str(e.get("msg", "")) for e in self.job_events(job))

    def artifact_names(self) -> set[str]:
        return {path.parent.name for path in self.artifacts.glob("*/*/*.zip")}

    def artifact(self, name: str) -> dict[str, bytes]:
        """The files in the artifact's zip, by name."""
        (archive,) = self.artifacts.glob(f"*/{name}/{name}.zip")
        with zipfile.ZipFile(archive) as zipped:
            return {info.filename: zipped.read(info) for info in zipped.infolist()}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class ActSetup:
    """Where act runs and what it is given: the scratch copy, the action copies, ``--env``."""

    act: str
    scratch: Scratch
    fixtures: Path
    env: Mapping[str, str]
    #: The built copy of ``DOWNLOAD_ARTIFACT`` (tests/act/offline_actions.py).
    download_artifact: Path


@dataclass(frozen=True)
class ActEvent:
    """The event act raises (``push`` by default), its payload file and the ``vars``."""

    name: str = "push"
    payload: Path | None = None
    variables: Mapping[str, str] = field(default_factory=dict)


def act_argv(
    setup: ActSetup,
    workflow: str,
    artifacts: Path,
    env: Mapping[str, str],
    event: ActEvent | None = None,
) -> list[str]:
    fixtures, scratch = setup.fixtures, setup.scratch
    event = event or ActEvent()
    argv = [
        setup.act, event.name, "--json",
        "-W", f".github/workflows/{workflow}",
        "-P", "self-hosted=-self-hosted",
        "--action-offline-mode",
        "--local-repository", f"{UPLOAD_ARTIFACT}={fixtures / UPLOAD_ARTIFACT.split('/')[1]}",
        "--local-repository", f"{CHECKOUT}={fixtures / CHECKOUT.split('/')[1]}",
        "--local-repository", f"{DOWNLOAD_ARTIFACT}={setup.download_artifact}",
        "--local-repository", f"{ORIGIN}@v0={scratch.repo}",
        "--artifact-server-path", str(artifacts),
        "--artifact-server-addr", "127.0.0.1",
        "--artifact-server-port", str(_free_port()),
        "--cache-server-addr", "127.0.0.1",
        "--concurrent-jobs", "3",
        "-s", f"GITHUB_TOKEN={OFFLINE_TOKEN}",
    ]  # fmt: skip
    for key, value in {**setup.env, **env}.items():
        argv += ["--env", f"{key}={value}"]
    if event.payload is not None:
        argv += ["--eventpath", str(event.payload)]
    for key, value in event.variables.items():
        argv += ["--var", f"{key}={value}"]
    return argv


def _stop_group(proc: subprocess.Popen[str]) -> None:
    """End act and every step process it started (its own process group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=_STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def remove_containers_under(root: Path) -> list[str]:
    """Remove the action's containers (``bi-cell-*``) that mount a folder under ``root``."""
    listed = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "name=bi-cell-"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    ours: list[str] = []
    for container in listed:
        inspected = subprocess.run(
            ["docker", "inspect", "--format", "{{json .Mounts}}", container],
            capture_output=True,
            text=True,
            timeout=60,
        )
        mounts = json.loads(inspected.stdout or "[]") or []
        if any(str(m.get("Source", "")).startswith(f"{root}{os.sep}") for m in mounts):
            ours.append(container)
    if ours:
        subprocess.run(["docker", "rm", "-f", *ours], capture_output=True, timeout=120)
    return ours


def run_act(
    setup: ActSetup,
    workflow: str,
    out: Path,
    timeout_s: float,
    extra_env: Mapping[str, str] | None = None,
    event: ActEvent | None = None,
) -> ActRun:
    """Run act on ``workflow`` (a file name under the copy's .github/workflows) with its
    artifacts, evidence (``BI_ACT_EVIDENCE``) and log under ``out``, ``extra_env`` added
    to the setup's ``--env``; act's exit code is kept, never raised."""
    artifacts, evidence, log = out / "artifacts", out / "evidence", out / "act.log"
    for folder in (artifacts, evidence):
        folder.mkdir(parents=True)
    process_env = {
        key: os.environ[key]
        for key in ("PATH", "DOCKER_HOST", "TMPDIR", "LANG")
        if key in os.environ
    }
    process_env.update(HOME=str(setup.scratch.home), ACT_DISABLE_VERSION_CHECK="1")
    act_env = {**(extra_env or {}), "BI_ACT_EVIDENCE": str(evidence)}
    started = time.monotonic()
    with log.open("w") as stream:
        proc = subprocess.Popen(
            act_argv(setup, workflow, artifacts, act_env, event),
            cwd=setup.scratch.repo,
            env=process_env,
            stdout=stream,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            returncode = proc.wait(timeout=timeout_s)
        except BaseException:
            _stop_group(proc)
            raise
        finally:
            remove_containers_under(setup.scratch.home.parent)
    text = log.read_text(errors="replace")
    return ActRun(
        returncode=returncode,
        events=list(_json_lines(text)),
        artifacts=artifacts,
        evidence=evidence,
        seconds=time.monotonic() - started,
        text=text,
    )


def _json_lines(text: str) -> Iterator[dict[str, Any]]:
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                yield event
