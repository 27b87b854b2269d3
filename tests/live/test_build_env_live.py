"""The provisioned llama-server (a static CPU build linking only libgomp) reads OpenMP's
variables and no OpenBLAS's: started on a host whose environment holds ``OPENBLAS_CORETYPE``
and ``OPENBLAS_L2_SIZE``, the real child does not get them and its record (the cert's
``engine_env``) does not name them, while ggml's and OpenMP's are passed and recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance.engines.base import LaunchRequest
from batch_invariance.engines.llama_server.engine import LlamaServerEngine
from batch_invariance.engines.llama_server.linked import linked_runtimes, read_dynamic
from batch_invariance.provision.embedded import Provisioned
from batch_invariance.servers import ports
from batch_invariance.servers.process import ServerProcess

HOST = {
    "OPENBLAS_CORETYPE": "Haswell",
    "OPENBLAS_L2_SIZE": "1048576",
    "OMP_NUM_THREADS": "2",
    "GGML_SCHED_MAX_COPIES": "4",
}


def test_the_provisioned_build_records_no_openblas_variable(
    live_pair: Provisioned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dynamic = read_dynamic(live_pair.server_bin)
    assert dynamic is not None and any(s.startswith("libgomp") for s in dynamic.needed)
    assert not any("openblas" in s for s in dynamic.needed)
    assert linked_runtimes(live_pair.server_bin) == frozenset({"OpenMP"})
    for name, value in HOST.items():
        monkeypatch.setenv(name, value)
    engine = LlamaServerEngine()
    port = ports.pick_free(ports.DEFAULT_RESERVED)
    request = LaunchRequest(live_pair.server_bin, live_pair.model, 1, 256, ports.LOOPBACK, port)
    command = engine.launch_command(request)
    with ServerProcess(engine, command, arm="A", parallel=1, ctx=256, port=port,
                       log_dir=tmp_path / "out") as srv:  # fmt: skip
        assert srv.pid is not None
        raw = Path(f"/proc/{srv.pid}/environ").read_bytes().split(b"\0")
        environ = dict(e.decode().split("=", 1) for e in raw if e)
        recorded = srv.info()["engine_env"]
    assert "OPENBLAS_CORETYPE" not in environ and "OPENBLAS_L2_SIZE" not in environ
    assert environ["OMP_NUM_THREADS"] == "2" and environ["GGML_SCHED_MAX_COPIES"] == "4"
    assert {k: recorded[k] for k in HOST if k in recorded} == {
        "OMP_NUM_THREADS": "2",
        "GGML_SCHED_MAX_COPIES": "4",
    }
