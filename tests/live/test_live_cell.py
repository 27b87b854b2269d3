"""Live cells against the real llama-server on the embedded default (Gemma 3 270M, CPU).

Kept small (short generations, few passes) so the whole file runs in a few minutes on
2 cores. Every server started here is torn down by the code under test; the tests check that.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from batch_invariance import exitcodes
from batch_invariance.cli import build_parser, main
from batch_invariance.commands.cell_options import request_from_args
from batch_invariance.provision.embedded import Provisioned
from batch_invariance.report.render import live_banner
from batch_invariance.service.live import prepare, run_live_cell
from batch_invariance.service.target import engine_launcher
from tests.support.fakes_live import LOOSE_GATES, exiting_server, group_alive
from tests.support.nvidia_smi import TWO_H200, install_nvidia_smi
from tests.support.paths import WORKSETS

DEMO_WORKSET = WORKSETS / "demo.json"
#: A GPU runner's selection: GPU 1, every GPU exposed by the container runtime.
MEASURED_PLACEMENT = {"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "all"}
#: Completion openings for the base model on /v1/completions: co-batching changes several of
#: them in every pass (on the chat endpoint only 1-2 of 16, and not in every pass).
COMPLETIONS_WORKSET = WORKSETS / "demo_completions.json"


def _completions_subset(folder: Path, rows: int = 12) -> Path:
    path = folder / "completions.json"
    path.write_text(json.dumps(json.loads(COMPLETIONS_WORKSET.read_text())[:rows]))
    return path


#: The bundled work-set, short generations, two passes: RED on this pair (measured; see
#: examples/certs/README.md), in well under a minute on 2 idle cores.
RED_CELL = "--ctx 512 --parallel 4 --gate-passes 2 --reps 1 --n-predict 64 --no-serial-repeat"
#: Tiny: the point is the gate, not the content.
NO_COBATCH_CELL = (
    "--ctx 256 --parallel 2 --gate-passes 1 --reps 1 --n-predict 16 --no-serial-repeat "
    "--min-hot-trials 1"
)
#: Long enough that arm C is still running when the signal arrives.
SIGINT_CELL = (
    "--ctx 512 --parallel 4 --gate-passes 6 --reps 1 --n-predict 96 --no-serial-repeat "
    "--no-stop-on-red"  # the signal must land in a C pass, not after a RED ended them
)


def _args(pair: Provisioned, workset: Path, out: Path, *extra: str) -> list[str]:
    return [
        "run-live",
        "--server-bin", str(pair.server_bin),
        "--model", str(pair.model),
        "--workset", str(workset),
        "--out-dir", str(out),
        *extra,
    ]  # fmt: skip


def test_bundled_workset_reaches_red_with_every_gate_met(
    live_pair: Provisioned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Measured the way a GPU runner runs it: a selection in the environment, an nvidia-smi
    # (a stand-in listing two H200s here) on PATH.
    smi = install_nvidia_smi(tmp_path / "smi", TWO_H200)
    monkeypatch.setenv("PATH", f"{smi}:{os.environ['PATH']}")
    for name, value in MEASURED_PLACEMENT.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(
        _args(
            live_pair,
            _completions_subset(tmp_path),
            tmp_path / "out",
            *RED_CELL.split(),
            "--endpoint",
            "completions",
        )
    )
    outcome = run_live_cell(prepare(request_from_args(args)))
    cert = outcome.finished.cert
    assert cert.source == "live"
    assert cert.status == "failed", cert.decision_reasons
    assert cert.divergence_class is not None and "co_batching" in cert.divergence_class
    assert cert.overlap.ok and cert.completion_floor.ok and cert.cobatch_coverage.ok
    assert cert.transport.ok
    assert cert.divergence_report.ac.n_divergent >= 1
    # Numeric evidence from the real server: every arm carries pre-sampling logprobs at
    # every token, and batching moved them on (nearly) every row, flipped or not.
    numerics = cert.numerics
    assert numerics.evidence.ok, numerics.evidence.reason
    compared = numerics.ac.per_pass[0].rows_compared
    assert compared == 12 and all(p.rows_with_drift >= 8 for p in numerics.ac.per_pass)
    assert numerics.ac.max_abs_delta is not None and numerics.ac.max_abs_delta > 0.0
    assert numerics.risk.per_token_flip_probability is not None
    banner = live_banner(cert, Path("c.json"), None, "live")
    assert "numerics: AC rows with logprob drift per pass" in banner
    assert outcome.finished.path.is_file()
    prov = cert.provenance.record()
    assert prov["server_binary"]["sha256"] == live_pair.server_sha256
    assert prov["model_file"]["sha256"] == live_pair.model_sha256
    assert prov["model_file"]["gguf"]["architecture"] == "gemma3"
    # Every item names the request the server saw; the subset's prompts are all distinct.
    keys = {item.request_key for item in cert.evidence.items}
    assert None not in keys and len(keys) == len(cert.evidence.items)
    assert prov["workset"]["duplicate_prompts"] == []
    assert prov["is_moe"] is False
    assert prov["host"]["cpu_count"] >= 1 and prov["host"]["os"]
    assert prov["server_launches"] == 2
    argvs = [s["argv"] for s in prov["servers"]]
    assert "--metrics" in argvs[1] and argvs[1][argvs[1].index("--ctx-size") + 1] == "2048"
    assert "split" in cert.kv_label
    # The real live cert passes the one verification path, identity against provenance too.
    from batch_invariance.cert.verify import verify

    verification = verify(outcome.finished.path)
    assert verification.valid, verification.problems
    assert verification.verdict == "RED" and not verification.promotable
    _placement_recorded_and_held(prov, tmp_path / "deploy")


def _placement_recorded_and_held(prov: dict[str, Any], root: Path) -> None:
    """The selection is no engine variable; GPU 1's facts are the cert's ``gpus``; a deploy
    on GPU 0 of the same model passes with a promotable cert of that provenance."""
    from tests.support.deploy_world import (
        OK_FLAGS,
        _live_cert,
        _provenance,
        deploy_files,
        served,
    )

    for server in prov["servers"]:
        assert not set(server["info"]["engine_env"]) & set(MEASURED_PLACEMENT), server
    assert prov["gpus"] == {
        "source": "nvidia-smi",
        "devices": [{"name": "NVIDIA H200", "memory_total_mib": 143771,
                     "driver_version": "570.86.15", "compute_cap": "9.0"}],
    }  # fmt: skip
    root.mkdir()
    model, binary = deploy_files(root)
    provenance = _provenance(model, 4, "split")
    provenance["gpus"] = prov["gpus"]
    for server in provenance["servers"]:
        server["info"] = {"engine_env": prov["servers"][1]["info"]["engine_env"]}
    certs = root / "certs"
    _live_cert(certs, model, provenance=provenance)
    deploy = root / "llama-server.sh"
    # The deploy starts serve (a direct start is never a pass) and selects GPU 0.
    deploy.write_text(
        f"export PATH={binary.parent}:/usr/bin:/bin\nexport CUDA_VISIBLE_DEVICES=0\n"
        f"exec {served(f'llama-server -m {model} {OK_FLAGS}', certs)}\n"
    )
    code = main(["check-deploy", str(deploy), "--certs", str(certs), "--allow-unsigned"])
    assert code == exitcodes.PROMOTABLE


def test_concurrent_dispatch_on_a_server_that_cannot_cobatch_is_never_green(
    live_pair: Provisioned, tmp_path: Path, demo_subset: Callable[[int], Path]
) -> None:
    args = build_parser().parse_args(
        _args(
            live_pair,
            demo_subset(4),
            tmp_path / "out",
            *NO_COBATCH_CELL.split(),
        )
    )
    request = request_from_args(args)
    # The B/C server gets --parallel 1 behind a C arm that dispatches 2 at once: the test's
    # own launcher factory caps every server's slots.
    outcome = run_live_cell(prepare(request), launcher_for=partial(engine_launcher, cap_parallel=1))
    cert = outcome.finished.cert
    assert cert.status == "green_unverified", (cert.status, cert.decision_reasons)
    assert not cert.overlap.ok
    assert all((p.server_busy_max or 0) <= 1 for p in cert.overlap.per_pass)
    assert outcome.launcher.launches[-1].parallel == 1
    # One request at a time on a --parallel 1 server: the logprobs are bitwise A's.
    assert cert.numerics.evidence.ok and cert.numerics.ac.positions > 0
    assert cert.numerics.ac.drift_ids == () and cert.numerics.ab.drift_ids == ()


def _ctrl_c_default() -> None:
    # A shell that started the suite in the background hands it SIGINT ignored, and an ignored
    # SIGINT stays ignored in the tool: give it the disposition a terminal's Ctrl-C meets.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "batch_invariance", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_default,
    )


def test_a_server_that_exits_at_once_fails_fast_with_exit_4(
    live_pair: Provisioned, tmp_path: Path, demo_subset: Callable[[int], Path]
) -> None:
    broken = exiting_server(tmp_path / "bin")
    # LOOSE_GATES' bound (--max-bound 1) needs 3 distinct prompts: fewer is refused before any
    # launch (exit 2), and this test is about the launch.
    argv = _args(live_pair, demo_subset(3), tmp_path / "out", "--ctx", "256", "--parallel", "2",
                 *LOOSE_GATES)  # fmt: skip
    argv[argv.index("--server-bin") + 1] = str(broken)
    t0 = time.monotonic()
    proc = _cli(*argv)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 10.0
    assert proc.returncode == exitcodes.INFRA, err
    assert "this server cannot start" in err  # the log tail
    assert "Traceback" not in err
    assert list((tmp_path / "out").glob("*.json")) == []


def _busy_slots(port: int) -> int:
    try:
        slots = requests.get(f"http://127.0.0.1:{port}/slots", timeout=1).json()
    except (requests.RequestException, ValueError):
        return 0
    return sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))


def _server_in_arm_c(
    proc: subprocess.Popen[str], out_dir: Path, within_s: float = 240.0
) -> int | None:
    """The pid of the B/C server the tool started, once arm C runs on it: the server reports
    two slots busy at once (arm B is serial, so it never does)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and proc.poll() is None:
        logs = list(out_dir.glob("server-BC-*.log"))
        if logs:
            port = int(logs[0].stem.rsplit("-", 1)[1])
            if _busy_slots(port) >= 2:
                for child in psutil.Process(proc.pid).children():
                    if str(port) in child.cmdline():
                        return child.pid
        time.sleep(0.05)
    return None


def test_sigint_in_the_middle_of_arm_c(
    live_pair: Provisioned,
    tmp_path: Path,
    demo_subset: Callable[[int], Path],
    decoy: subprocess.Popen[bytes],
) -> None:
    out_dir = tmp_path / "out"
    proc = _cli(*_args(live_pair, demo_subset(8), out_dir, *SIGINT_CELL.split(), *LOOSE_GATES))
    try:
        server_pid = _server_in_arm_c(proc, out_dir)
        assert server_pid is not None, "arm C never started"
        assert group_alive(server_pid, settle_s=0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == exitcodes.SIGINT, err
    assert "no cert written" in err and "Traceback" not in err
    assert not group_alive(server_pid)
    assert decoy.poll() is None  # the decoy named llama-server survived
    assert list(out_dir.glob("*.json")) == []


#: Short: 2 slots, 4 prompts, 3 passes; the kill lands in the first pass that is seen busy
#: (every pass runs: a RED must not end them before the kill).
KILL_CELL = (
    "--ctx 256 --parallel 2 --gate-passes 3 --reps 1 --n-predict 32 --no-serial-repeat "
    "--no-stop-on-red"
)


def test_a_server_killed_mid_pass_ends_the_run_with_exit_4_and_no_cert(
    live_pair: Provisioned, tmp_path: Path, demo_subset: Callable[[int], Path]
) -> None:
    """SIGKILL of the real B/C llama-server (by its pid) inside a concurrent pass: the tool
    stops at once with one line naming the arm, the pass and the server log, and no cert."""
    out_dir = tmp_path / "out"
    proc = _cli(*_args(live_pair, demo_subset(4), out_dir, *KILL_CELL.split(), *LOOSE_GATES))
    try:
        # Seconds on an idle host; a host shared by many jobs may take minutes to reach C.
        server_pid = _server_in_arm_c(proc, out_dir, within_s=540.0)
        assert server_pid is not None, "arm C never started"
        killed_at = time.monotonic()
        os.kill(server_pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        stopped_s = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == exitcodes.INFRA, err
    errors = [line for line in err.splitlines() if line.startswith("batch-invariance: error")]
    assert len(errors) == 1, err
    assert re.match(
        r"batch-invariance: error \[InfraError\]: run stopped in arm C pass [1-3]/3, no cert "
        r"written: llama-server \(BC:np2, port \d+\) died with code -9; log \S+server-BC-\d+\.log",
        errors[0],
    ), errors[0]
    assert "arm B" not in err  # nothing ran after the death
    assert "Traceback" not in err
    assert stopped_s < 30.0, f"the tool took {stopped_s:.1f} s to stop after the kill"
    assert list(out_dir.glob("*.json")) == []


def _server_child(tool_pid: int) -> int | None:
    """The pid of the llama-server the tool started, once its /health answers."""
    try:
        children = psutil.Process(tool_pid).children()
    except psutil.Error:
        return None
    for child in children:
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if "--port" in argv:
            port = argv[argv.index("--port") + 1]
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return child.pid
            except requests.RequestException:
                pass
    return None


def test_kill_9_of_the_tool_takes_its_server_down(
    live_pair: Provisioned, tmp_path: Path, demo_subset: Callable[[int], Path]
) -> None:
    """SIGKILL runs no Python code in the tool: only the parent-death signal stops the server."""
    out_dir = tmp_path / "out"
    proc = _cli(*_args(live_pair, demo_subset(8), out_dir, *SIGINT_CELL.split(), *LOOSE_GATES))
    server_pid = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and server_pid is None:
            server_pid = _server_child(proc.pid)
            time.sleep(0.05)
        assert server_pid is not None, "the tool never brought a server up"
        proc.kill()
        proc.wait()
        gone_by = time.monotonic() + 5.0
        while time.monotonic() < gone_by and group_alive(server_pid, settle_s=0):
            time.sleep(0.05)
        assert not group_alive(server_pid, settle_s=0), "llama-server outlived kill -9 of the tool"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if server_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server_pid, signal.SIGKILL)
    assert list(out_dir.glob("*.json")) == []


def test_dry_run_launches_nothing(live_pair: Provisioned, tmp_path: Path) -> None:
    before = {p.pid for p in psutil.process_iter()}
    out_dir = tmp_path / "out"
    proc = _cli(
        *_args(live_pair, DEMO_WORKSET, out_dir, *["--ctx", "1024", "--parallel", "4", "--dry-run"])
    )
    out, err = proc.communicate(timeout=60)
    # 16 chat prompts can never reach GREEN: the plan is printed whole, then refused.
    assert proc.returncode == exitcodes.USAGE, err
    assert "this plan cannot reach GREEN: too few distinct prompts: 16" in err
    assert str(live_pair.server_bin) in out and "requests:" in out
    assert not out_dir.exists()
    new = {p.pid for p in psutil.process_iter()} - before
    for pid in new:
        try:
            assert "llama-server" not in " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
