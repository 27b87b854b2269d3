"""ServerProcess / EngineLauncher process safety with fake server executables (real processes).

These tests never start the real llama-server (the live suite does); they start tiny scripts
that behave like one (ready, dead at once, hanging, forking a child, eating memory).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from batch_invariance.engines.base import Engine, LaunchRequest
from batch_invariance.engines.llama_server.engine import LlamaServerEngine, build_argv
from batch_invariance.engines.llama_server.env import is_engine_variable, is_neutral_variable
from batch_invariance.engines.registry import engine_for
from batch_invariance.errors import GuardRefused, InfraError, UsageError
from batch_invariance.host.gguf import parse_info
from batch_invariance.servers import ports
from batch_invariance.servers.launch import EngineLauncher
from batch_invariance.servers.process import ServerProcess
from batch_invariance.servers.spawn import log_tail
from batch_invariance.service.target import identify_binary
from tests.support.fakes_live import (
    dense_meta,
    exiting_server,
    fake_server,
    group_alive,
    write_gguf,
)


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "tiny.gguf", dense_meta())


LLAMA = LlamaServerEngine()


def _server(
    tmp_path: Path,
    model: Path,
    exe: Path,
    *,
    arm: str = "A",
    parallel: int = 1,
    extra_flags: tuple[str, ...] = (),
    engine: Engine = LLAMA,
    **kw: float,
) -> ServerProcess:
    port = ports.pick_free(ports.DEFAULT_RESERVED)
    request = LaunchRequest(exe, model, parallel, 512, ports.LOOPBACK, port, extra_flags)
    return ServerProcess(
        engine, engine.launch_command(request), arm=arm, parallel=parallel, ctx=512, port=port,
        log_dir=tmp_path / "out", **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_argv_sizes_every_slot_and_enables_metrics(tmp_path: Path) -> None:
    argv = build_argv(Path("/bin/ls"), Path("m.gguf"), host="127.0.0.1", port=9,
                      parallel=4, ctx=1024, extra_flags=("-ngl", "99"))  # fmt: skip
    assert argv[argv.index("--ctx-size") + 1] == "4096"
    assert argv[argv.index("--parallel") + 1] == "4"
    assert "--metrics" in argv and "--no-kv-unified" in argv
    assert argv[-2:] == ("-ngl", "99")


def test_ready_server_serves_and_its_group_is_gone_after_exit(
    tmp_path: Path, model: Path, decoy: subprocess.Popen[bytes]
) -> None:
    exe = fake_server(tmp_path / "bin")
    srv = _server(tmp_path, model, exe, arm="BC", parallel=3, extra_flags=("--fake-child",))
    with srv:
        assert requests.get(f"{srv.base_url}/health", timeout=5).status_code == 200
        assert srv.total_slots == 3
        srv.check_alive()
        pid = srv.pid
        assert pid is not None and group_alive(pid, settle_s=0)
        assert srv.log_path.name == f"server-BC-{srv.port}.log"
        assert srv.info()["ready_s"] is not None
    assert not group_alive(pid)  # the forked child went with its group
    assert decoy.poll() is None  # a process named llama-server we did not start survives
    assert "listening on" in log_tail(srv.log_path)


def test_a_server_that_exits_at_once_fails_fast_with_the_log_tail(
    tmp_path: Path, model: Path
) -> None:
    exe = exiting_server(tmp_path / "bin")
    srv = _server(tmp_path, model, exe, ready_timeout=60.0)
    t0 = time.monotonic()
    with pytest.raises(InfraError, match="exited with code 1") as err, srv:
        pass
    assert time.monotonic() - t0 < 2.0
    assert "this server cannot start" in str(err.value)
    assert str(err.value).startswith("llama-server (A:np1, port ")


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama-cpp-python"])
def test_another_engines_process_errors_name_that_engine(
    tmp_path: Path, model: Path, engine: str
) -> None:
    exe = exiting_server(tmp_path / "bin", name="python")
    srv = _server(tmp_path, model, exe, engine=engine_for(engine), ready_timeout=60.0)
    with pytest.raises(InfraError, match="exited with code 1") as err, srv:
        pass
    assert str(err.value).startswith(f"{engine} (A:np1, port ")
    assert "llama-server" not in str(err.value)


def test_a_server_that_never_gets_ready_times_out_and_is_killed(
    tmp_path: Path, model: Path
) -> None:
    exe = fake_server(tmp_path / "bin")
    srv = _server(tmp_path, model, exe, ready_timeout=1.0, extra_flags=("--fake-hang",))
    with pytest.raises(InfraError, match="not ready after 1 s") as err, srv:
        pass
    assert "fake llama-server starting" in str(err.value)
    assert srv.pid is not None and not group_alive(srv.pid)


def test_slot_count_mismatch_is_an_infra_error(tmp_path: Path, model: Path) -> None:
    exe = fake_server(tmp_path / "bin")
    srv = _server(tmp_path, model, exe, parallel=4, extra_flags=("--fake-slots", "1"))
    with pytest.raises(InfraError, match="reports 1 slots, expected 4"), srv:
        pass
    assert srv.pid is not None and not group_alive(srv.pid)


def test_check_alive_notices_a_dead_server(tmp_path: Path, model: Path) -> None:
    exe = fake_server(tmp_path / "bin")
    with _server(tmp_path, model, exe) as srv:
        assert srv.pid is not None
        os.killpg(srv.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                srv.check_alive()
            except InfraError as exc:
                assert "died with code" in str(exc)
                break
            time.sleep(0.05)
        else:
            pytest.fail("check_alive never noticed the dead server")


def test_rss_past_the_cap_aborts_the_server(tmp_path: Path, model: Path) -> None:
    exe = fake_server(tmp_path / "bin")
    srv = _server(tmp_path, model, exe, rss_cap_bytes=1, extra_flags=("--fake-ballast-mb", "8"))
    with srv:
        deadline = time.monotonic() + 5
        while srv.aborted is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.aborted is not None and "passed the cap" in srv.aborted
        with pytest.raises(InfraError, match="passed the cap"):
            srv.check_alive()
        assert srv.pid is not None and not group_alive(srv.pid)


def _launcher(tmp_path: Path, model: Path, exe: Path, **kw: object) -> EngineLauncher:
    return EngineLauncher(
        LLAMA,
        exe,
        model,
        tmp_path / "out",
        port_policy=ports.make_policy(None, None),
        gguf=parse_info(model),
        **kw,  # type: ignore[arg-type]
    )


def test_launcher_guard_refuses_before_launching(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "launched"
    monkeypatch.setenv("FAKE_SERVER_MARKER", str(marker))
    launcher = _launcher(tmp_path, model, fake_server(tmp_path / "bin"), max_footprint_gb=1e-6)
    with pytest.raises(GuardRefused, match="max-footprint-gb"), launcher.launch("A", 1, 512):
        pass
    assert not marker.exists() and launcher.launches == []


def test_launcher_records_launches_and_caps_parallel(tmp_path: Path, model: Path) -> None:
    launcher = _launcher(tmp_path, model, fake_server(tmp_path / "bin"), cap_parallel=1)
    with launcher.launch("BC", 4, 256) as srv:
        assert srv.process.parallel == 1 and srv.process.total_slots == 1
    rec = launcher.launches[0]
    assert (rec.arm, rec.parallel, rec.ctx) == ("BC", 1, 256)
    assert rec.ready_s is not None and rec.alive_s is not None
    assert launcher.aborted is None


def test_the_launch_runs_the_planned_argv_with_the_asked_kv_layout(
    tmp_path: Path, model: Path
) -> None:
    launcher = _launcher(tmp_path, model, fake_server(tmp_path / "bin"), kv_layout="unified")
    with launcher.launch("A", 1, 256) as a:
        # One sequence: its layout cannot matter, so the serial server runs split.
        assert "--no-kv-unified" in a.argv and a.kv_label.startswith("split:-c 256 -np 1")
    with launcher.launch("BC", 3, 256) as bc:
        assert "--kv-unified" in bc.argv and bc.kv_label.startswith("unified:-c 768 -np 3")
        assert bc.process.total_slots == 3 and bc.info()["kv_label"] == bc.kv_label
    assert [r.parallel for r in launcher.launches] == [1, 3]
    for rec in launcher.launches:
        assert rec.argv == launcher.planned(rec.parallel, rec.ctx, rec.port).command.argv


def test_launcher_raises_after_an_rss_abort(tmp_path: Path, model: Path) -> None:
    launcher = _launcher(tmp_path, model, fake_server(tmp_path / "bin"), max_footprint_gb=0.7,
                         server_flags=("--fake-ballast-mb", "900"))  # fmt: skip
    with pytest.raises(InfraError, match="passed the cap"), launcher.launch("A", 1, 256) as srv:
        deadline = time.monotonic() + 15
        while srv.process.aborted is None and time.monotonic() < deadline:
            time.sleep(0.05)
    assert launcher.aborted is not None


def test_identify_binary_records_version_and_hash(tmp_path: Path) -> None:
    exe = fake_server(tmp_path / "bin")
    ident = identify_binary(exe)
    assert ident.version.startswith("version: 0.0.0-fake") and ident.version_rc == 0
    assert len(ident.sha256) == 64
    broken = identify_binary(exiting_server(tmp_path / "b2"))
    assert broken.version_rc == 1  # recorded, not raised


def test_identify_binary_kills_a_hanging_version_and_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    exe = tmp_path / "llama-server"
    # --version forks a long sleeper and then hangs itself.
    exe.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nsleep 300\n")
    exe.chmod(0o755)
    started = time.monotonic()
    ident = identify_binary(exe, timeout_s=1.0)
    assert time.monotonic() - started < 10
    assert ident.version_rc is None and "did not finish" in ident.version
    child = int(pidfile.read_text())

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 5
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(child)  # the forked sleeper went with the group


def test_port_policy() -> None:
    policy = ports.make_policy(None, [9999])
    assert policy.reserved == {8080, 9999}
    with pytest.raises(UsageError, match="reserved"):
        ports.make_policy(8080, None)
    with pytest.raises(UsageError, match="not a TCP port"):
        ports.make_policy(70000, None)
    for _ in range(20):
        assert ports.choose(policy) not in policy.reserved


def test_a_busy_fixed_port_is_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(GuardRefused, match="in use"):
            ports.choose(ports.make_policy(busy, None))
    assert ports.choose(ports.make_policy(busy, None)) == busy  # free again once closed


_HOLDER = r"""
import sys, time
from pathlib import Path
from batch_invariance.engines.base import LaunchRequest
from batch_invariance.engines.llama_server.engine import LlamaServerEngine
from batch_invariance.servers import ports
from batch_invariance.servers.process import ServerProcess
exe, model, log_dir, mode = sys.argv[1:5]
port = ports.pick_free(ports.DEFAULT_RESERVED)
engine = LlamaServerEngine()
command = engine.launch_command(LaunchRequest(Path(exe), Path(model), 1, 256, ports.LOOPBACK, port))
srv = ServerProcess(engine, command, arm="A", parallel=1, ctx=256, port=port,
                    log_dir=Path(log_dir))
if mode == "atexit":
    srv.start()
    srv.wait_ready()
    print(srv.pid, flush=True)
    sys.exit(0)  # no __exit__: only the atexit hook can stop it
with srv:
    print(srv.pid, flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("mode", ["sigterm", "atexit", "sigkill"])
def test_no_server_outlives_its_owner(
    tmp_path: Path, model: Path, mode: str, decoy: subprocess.Popen[bytes]
) -> None:
    exe = fake_server(tmp_path / "bin")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(exe), str(model), str(tmp_path / "out"), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        pid = int(holder.stdout.readline())
        if mode in ("sigterm", "sigkill"):
            assert group_alive(pid, settle_s=0)
            # SIGKILL runs no Python code: only the parent-death signal can stop the server.
            holder.send_signal(signal.SIGTERM if mode == "sigterm" else signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    try:
        assert not group_alive(pid, settle_s=5.0)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    assert decoy.poll() is None


def test_host_summary_names_os_cpus_and_memory() -> None:
    from batch_invariance.host import facts as host

    facts = host.summary()
    assert set(facts) == {"os", "machine", "python", "cpu_model", "cpu_count", "cpu_usable",
                          "cpu_flags", "mem_total_bytes", "gpus"}  # fmt: skip
    assert facts["os"] and facts["cpu_count"] >= facts["cpu_usable"] >= 1
    assert isinstance(facts["mem_total_bytes"], int) and facts["mem_total_bytes"] > 0
    assert isinstance(facts["gpus"], list)


def test_a_measured_server_gets_only_neutral_and_engine_variables(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule serve applies is the rule run-live's servers ran under: read from the real
    child's /proc/PID/environ, and what the cert records (``engine_env``) is all of the rest."""
    hostile = {"LD_AUDIT": "/nonexistent/audit.so", "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0",
               "MALLOC_ARENA_MAX": "2", "LLAMA_ARG_UBATCH": "512", "MY_SETTING": "1"}  # fmt: skip
    for name, value in {**hostile, "GGML_TEST_SWITCH": "1", "LC_ALL": "C"}.items():
        monkeypatch.setenv(name, value)
    exe = fake_server(tmp_path / "bin")
    with _server(tmp_path, model, exe) as srv:
        assert srv.pid is not None
        raw = Path(f"/proc/{srv.pid}/environ").read_bytes().split(b"\0")
        environ = dict(e.decode().split("=", 1) for e in raw if e)
        recorded = srv.info()["engine_env"]
    assert not set(environ) & set(hostile)
    assert environ["GGML_TEST_SWITCH"] == "1" and environ["LC_ALL"] == "C"
    assert environ["XDG_CONFIG_HOME"] == "/dev/null"
    assert recorded == {k: v for k, v in environ.items() if is_engine_variable(k)}
    assert recorded["GGML_TEST_SWITCH"] == "1"
    assert all(
        is_neutral_variable(k) or is_engine_variable(k) for k in environ if k != "XDG_CONFIG_HOME"
    ), environ
