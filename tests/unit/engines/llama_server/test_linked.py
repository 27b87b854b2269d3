"""A cert records the variables the measured build can read: a runtime's (``OPENBLAS_*``,
``CUDA_*``, ``OMP_*`` ...) only where the build links it, read from the build's ELF files;
ggml's and llama.cpp's own always. The builds here are small ELF files (tests/support/elf.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from batch_invariance.engines.base import LaunchCommand
from batch_invariance.engines.llama_server.engine import LlamaServerEngine
from batch_invariance.engines.llama_server.env import engine_env, measured_env
from batch_invariance.engines.llama_server.linked import (
    Dynamic,
    build_files,
    linked_runtimes,
    read_dynamic,
)
from batch_invariance.servers.process import ServerProcess
from tests.support.elf import llama_build, write_elf

#: What a host's environment held when it measured (its OpenBLAS tuning, an OpenMP knob,
#: ggml's and llama.cpp's own switches, the loader's preload).
HOST = {
    "OPENBLAS_CORETYPE": "Haswell",
    "OPENBLAS_L2_SIZE": "1048576",
    "OMP_NUM_THREADS": "2",
    "GGML_SCHED_MAX_COPIES": "4",
    "LLAMA_GRAPH_REUSE_DISABLE": "1",
    "CUDA_LAUNCH_BLOCKING": "1",
    "LD_PRELOAD": "/opt/x.so",
    "PATH": "/usr/bin",
}
ALWAYS = {"GGML_SCHED_MAX_COPIES": "4", "LLAMA_GRAPH_REUSE_DISABLE": "1", "LD_PRELOAD": "/opt/x.so"}
OPENBLAS = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "1048576"}


def test_a_build_without_openblas_does_not_record_openblas_variables(tmp_path: Path) -> None:
    binary = llama_build(tmp_path / "bin")
    linked = linked_runtimes(binary)
    # libggml.so links libgomp: the OpenMP runtime's variables count, OpenBLAS's and CUDA's not.
    assert linked == frozenset({"OpenMP"})
    assert engine_env(HOST, linked) == {**ALWAYS, "OMP_NUM_THREADS": "2"}
    child = measured_env(HOST, linked)
    assert "OPENBLAS_CORETYPE" not in child and "CUDA_LAUNCH_BLOCKING" not in child
    assert child["GGML_SCHED_MAX_COPIES"] == "4" and child["PATH"] == "/usr/bin"


def test_a_build_that_loads_an_openblas_backend_records_them(tmp_path: Path) -> None:
    # ggml's BLAS backend beside the binary, loaded at run time (no file names it), links
    # libopenblas: the build reads OPENBLAS_* (and OpenMP's, which OpenBLAS may bring).
    binary = llama_build(tmp_path / "bin", backends={"libggml-blas.so": ("libopenblas.so.0",)})
    linked = linked_runtimes(binary)
    assert linked == frozenset({"OpenBLAS", "OpenMP"})
    assert engine_env(HOST, linked) == {**ALWAYS, **OPENBLAS, "OMP_NUM_THREADS": "2"}


def test_a_build_linking_openblas_directly_records_them(tmp_path: Path) -> None:
    binary = write_elf(tmp_path / "llama-server", ("libopenblas.so.0", "libc.so.6"))
    assert linked_runtimes(binary) == frozenset({"OpenBLAS"})
    # OpenBLAS may bring its OpenMP runtime: OMP_* count with it.
    assert engine_env(HOST, linked_runtimes(binary)) == {
        **ALWAYS, **OPENBLAS, "OMP_NUM_THREADS": "2"
    }  # fmt: skip


def test_a_statically_linked_library_is_seen_by_the_names_it_carries(tmp_path: Path) -> None:
    # A static build: no dynamic section; OpenBLAS's own variable names are in its bytes.
    # GGML_CUDA_* is ggml's (it starts GGML_), never the CUDA runtime's.
    payload = b"\0GGML_CUDA_NO_PINNED\0xOMP_NUM\0OPENBLAS_NUM_THREADS\0"
    binary = write_elf(tmp_path / "llama-server", static=True, payload=payload)
    assert read_dynamic(binary) == Dynamic()
    assert linked_runtimes(binary) == frozenset({"OpenBLAS"})
    plain = write_elf(tmp_path / "plain" / "llama-server", static=True, payload=b"\0GGML_X\0")
    assert linked_runtimes(plain) == frozenset()
    assert engine_env(HOST, linked_runtimes(plain)) == ALWAYS


def test_a_build_not_read_whole_counts_every_runtime(tmp_path: Path) -> None:
    # One of llama.cpp's own libraries is not where the build is looked for: unknown, and
    # every runtime's variables count (the rule before builds were read).
    binary = write_elf(tmp_path / "bin" / "llama-server", ("libllama.so", "libc.so.6"))
    assert build_files(binary) is None and linked_runtimes(binary) is None
    assert engine_env(HOST, None) == {k: v for k, v in HOST.items() if k != "PATH"}
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\nexec true\n")
    assert read_dynamic(script) is None and linked_runtimes(script) is None
    assert linked_runtimes(tmp_path / "absent") is None


def test_the_build_libraries_are_found_by_the_run_path_and_in_lib(tmp_path: Path) -> None:
    write_elf(tmp_path / "lib" / "libllama.so", ("libvulkan.so.1",))
    write_elf(tmp_path / "elsewhere" / "libmtmd.so", ("libcudart.so.12",))
    binary = write_elf(
        tmp_path / "bin" / "llama-server",
        ("libllama.so", "libmtmd.so"),
        runpath="relative/only:$ORIGIN/../elsewhere",
    )
    files = build_files(binary)
    assert files is not None and len(files) == 3
    assert linked_runtimes(binary) == frozenset({"Vulkan", "CUDA"})


def test_the_engine_records_what_its_build_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server process asks the engine once; what the child gets is what the cert records.
    for name, value in HOST.items():
        monkeypatch.setenv(name, value)
    engine = LlamaServerEngine()
    for build, expected in (
        (llama_build(tmp_path / "plain"), {**ALWAYS, "OMP_NUM_THREADS": "2"}),
        (
            llama_build(tmp_path / "blas", backends={"libggml-blas.so": ("libopenblas.so.0",)}),
            {**ALWAYS, **OPENBLAS, "OMP_NUM_THREADS": "2"},
        ),
    ):
        srv = ServerProcess(engine, LaunchCommand(argv=(str(build), "--port", "1")), arm="BC",
                            parallel=2, ctx=256, port=1, log_dir=tmp_path / "logs")  # fmt: skip
        assert srv.info()["engine_env"] == expected
        assert srv._child_env()["OMP_NUM_THREADS"] == "2"
        assert ("OPENBLAS_CORETYPE" in srv._child_env()) == ("OPENBLAS_CORETYPE" in expected)
    assert engine.linked_runtimes(()) is None


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf not installed")
def test_the_reader_agrees_with_readelf_on_a_real_binary() -> None:
    real = Path(sys.executable).resolve()
    listing = subprocess.run(
        ["readelf", "-d", str(real)], capture_output=True, text=True, check=True,
        env={**os.environ, "LC_ALL": "C"},
    ).stdout  # fmt: skip
    expected = tuple(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", listing))
    dynamic = read_dynamic(real)
    assert dynamic is not None and dynamic.needed == expected
