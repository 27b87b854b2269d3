"""llama.cpp's own shared libraries beside the server binary are part of the measured build
(issue 40): run-live records each by sha256 (``provenance.server_binary.libraries``), and
``serve`` at start and check-deploy (where the binary's folder is readable) refuse a build
whose libraries are not those.

Real ELF files compiled by gcc (tests/support/elf.py): a binary that links ``libggml-base.so``
from beside it (``DT_NEEDED``, run path ``$ORIGIN``), as a default cmake build and the official
image do, and one with ggml in it. The served program prints the marker its ggml returns, so a
passing serve shows the library the exec'd binary really loaded.
"""

# ruff: noqa: F811 (the world fixture, imported)
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from batch_invariance import exitcodes
from batch_invariance.cert.provenance import BinaryRecord
from batch_invariance.cert.verify import verify
from batch_invariance.engines.base import BuildLibraries
from batch_invariance.engines.llama_server.engine import LlamaServerEngine
from batch_invariance.engines.llama_server.env import is_engine_variable
from batch_invariance.host.facts import cpu_flags, sha256_file
from batch_invariance.serve.cpu_variant import cpu_variant_problem
from batch_invariance.service.target import identify_binary
from tests.support.deploy_world import (  # noqa: F401 (the fixture)
    OK_FLAGS,
    Capsys,
    World,
    _live_cert,
    _provenance,
    assert_decision,
    gate,
    served,
    world,
)
from tests.support.elf import MEASURED_MARKER, gcc_build
from tests.support.paths import EXAMPLES

LIBRARY = "libggml-base.so"
#: A ggml CPU backend variant, loaded at run time from beside the binary (no file names it).
BACKEND = "libggml-cpu-haswell.so"


def _measured(binary: Path) -> dict[str, Any]:
    """``provenance.server_binary`` as run-live records it."""
    return identify_binary(binary, LlamaServerEngine()).record().record()


def _cert(world: World, out: Path, binary: Path, host: Any = "here", **record: Any) -> Path:
    """A promotable cert that measured ``binary`` (its ``server_binary`` as run-live records
    it, with ``record`` over it: ``libraries=None`` leaves the key out, as older certs do) on a
    host with ``host`` (by default this one's CPU)."""
    provenance = _provenance(world["model"], 4, "split", binary=binary)
    for server in provenance["servers"]:
        server["argv"][0] = str(binary)
    measured = {**_measured(binary), **record}
    provenance["server_binary"] = {k: v for k, v in measured.items() if v is not None}
    if host != "here":
        provenance["host"] = host
    return _live_cert(out, world["model"], provenance=provenance)


def _other_build(library: Path) -> None:
    """One byte of the library changed (the same length: it still loads)."""
    data = library.read_bytes()
    assert data.count(MEASURED_MARKER) == 1
    library.write_bytes(data.replace(MEASURED_MARKER, MEASURED_MARKER[:-1] + b"X"))


def test_run_live_records_each_llama_cpp_library_the_binary_loads(tmp_path: Path) -> None:
    dynamic = gcc_build(tmp_path / "dynamic")
    record = _measured(dynamic)
    assert record["libraries"] == [
        {"path": LIBRARY, "sha256": sha256_file(dynamic.parent / LIBRARY)}
    ]
    # --version ran the binary with its library: the measured build really loads it.
    assert record["version"] == f"version: 1 {MEASURED_MARKER.decode()}"
    # A run-time backend beside it and a link the loader opens by name count too.
    shutil.copyfile(dynamic.parent / LIBRARY, dynamic.parent / BACKEND)
    (dynamic.parent / "libggml-base.so.0").symlink_to(LIBRARY)
    names = [x["path"] for x in _measured(dynamic)["libraries"]]
    assert names == [LIBRARY, "libggml-base.so.0", BACKEND]
    # ggml in the binary (only system libraries): an empty list, recorded.
    assert _measured(gcc_build(tmp_path / "static", dynamic=False))["libraries"] == []
    # No ELF file (a script): nothing recorded, the key absent ("not recorded").
    script = tmp_path / "script" / "llama-server"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\necho version: 0\n")
    script.chmod(0o755)
    assert "libraries" not in _measured(script)
    # The key is typed: an entry without its sha256 is no cert.
    with pytest.raises(ValidationError):
        BinaryRecord.from_record({"libraries": [{"path": LIBRARY}]})
    # A cert written before the rule (the shipped example) still verifies: absent, never null,
    # means not recorded.
    example = verify(EXAMPLES / "certs" / "gemma-3-270m-q4_k_m__ctx1024__N4.json")
    assert example.valid and example.cert is not None
    binary = example.cert.provenance.server_binary
    assert binary is not None and binary.sha256 and binary.library_sha256() is None


def _serve(cert: Path, binary: Path | None = None, model: Path | None = None) -> Any:
    """``serve CERT`` (the measured argv at the measured paths) or, given ``binary``, ``serve
    --certs CERT -- BINARY -m MODEL ...``, in a subprocess: serve execs the binary, which
    prints what its ggml says."""
    clean = {k: v for k, v in os.environ.items() if not is_engine_variable(k)}
    line = ["--certs", str(cert)] if binary else [str(cert)]
    line += ["--allow-unsigned"]
    if binary:
        line += ["--", str(binary), "-m", str(model), *OK_FLAGS.split()]
    command = [sys.executable, "-m", "batch_invariance", "serve", *line]
    return subprocess.run(command, env=clean, capture_output=True, text=True, timeout=120)


def _served(done: subprocess.CompletedProcess[str]) -> None:
    """The binary ran, and found the library beside it ($ORIGIN) from its descriptor."""
    assert (done.returncode, done.stdout) == (0, f"served by {MEASURED_MARKER.decode()}\n"), done


def _refused(done: Any, *said: str, code: int = exitcodes.NOT_PROMOTABLE) -> None:
    assert done.returncode == code, done.stderr
    assert done.stdout == "", "the binary ran"
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    for words in said:
        assert words in done.stderr, done.stderr
    print(f"\n{done.stderr.strip()}")  # what an operator reads (pytest -s)


def test_serve_execs_only_the_llama_cpp_libraries_the_cert_measured(
    world: World, tmp_path: Path
) -> None:
    binary = gcc_build(tmp_path / "build")
    library = binary.parent / LIBRARY
    original, measured = library.read_bytes(), sha256_file(library)
    certs = _cert(world, tmp_path / "certs", binary).parent
    _served(_serve(certs, binary, world["model"]))
    # Another build's library: one changed byte.
    _other_build(library)
    _refused(
        _serve(certs, binary, world["model"]),
        f"llama.cpp library {LIBRARY} has sha256 {sha256_file(library)[:12]}... (measured "
        f"{measured[:12]}...): restore the measured library, or measure this build",
    )  # fmt: skip
    # The measured bytes back, and a library more (a ggml backend loaded at run time).
    library.write_bytes(original)
    shutil.copyfile(library, binary.parent / BACKEND)
    _refused(
        _serve(certs, binary, world["model"]),
        f"llama.cpp library {BACKEND} (sha256 {measured[:12]}...) is beside the server binary "
        f"but the cert measured only {LIBRARY}: remove it, or measure this build",
    )  # fmt: skip
    # A cert written before libraries were recorded does not cover a binary that loads some.
    (binary.parent / BACKEND).unlink()
    old = _cert(world, tmp_path / "old", binary, libraries=None).parent
    _refused(
        _serve(old, binary, world["model"]),
        f"the cert records no llama.cpp libraries and the server binary loads {LIBRARY} from "
        "beside it: re-measure the cell with this release, which records them",
    )  # fmt: skip
    _served(_serve(certs, binary, world["model"]))  # the measured build again


def test_serve_refuses_a_measured_library_gone_or_one_others_could_change(
    world: World, tmp_path: Path
) -> None:
    binary = gcc_build(tmp_path / "build")
    backend = binary.parent / BACKEND
    shutil.copyfile(binary.parent / LIBRARY, backend)
    cert = _cert(world, tmp_path / "certs", binary)
    _served(_serve(cert))  # serve CERT: the measured argv at the measured paths
    backend.chmod(0o664)  # the group could rewrite it under the running server
    _refused(_serve(cert), f"llama.cpp library {backend} is group-writable", code=exitcodes.USAGE)
    sha = sha256_file(backend)
    backend.unlink()  # ggml would pick another CPU variant: not the measured computation
    _refused(
        _serve(cert),
        f"llama.cpp library {BACKEND} the cert measured (sha256 {sha[:12]}...) is not beside "
        "the server binary: restore the measured build, or measure this one",
    )  # fmt: skip
    # The library the binary names is gone too: which ones it would load cannot be told here
    # (the loader would look in the system's folders), so nothing proves the build.
    (binary.parent / LIBRARY).unlink()
    _refused(
        _serve(cert),
        f"which llama.cpp libraries {binary} loads cannot be read (one it names is not beside it",
        "the build's llama.cpp libraries cannot be checked",
    )  # fmt: skip


def test_serve_starts_a_build_with_ggml_inside_on_an_empty_list(
    world: World, tmp_path: Path
) -> None:
    binary = gcc_build(tmp_path / "build", dynamic=False)
    cert = _cert(world, tmp_path / "certs", binary)
    assert '"libraries": []' in cert.read_text()
    _served(_serve(cert.parent, binary, world["model"]))
    # It loads no llama.cpp library, so a cert written before they were recorded covers it.
    old = _cert(world, tmp_path / "old", binary, libraries=None)
    assert '"libraries"' not in old.read_text()
    _served(_serve(old.parent, binary, world["model"]))


def test_check_deploy_holds_the_libraries_beside_a_readable_binary_to_the_cert(
    world: World, tmp_path: Path, capsys: Capsys
) -> None:
    binary = gcc_build(tmp_path / "build")
    library = binary.parent / LIBRARY
    original, measured = library.read_bytes(), sha256_file(library)
    certs = _cert(world, tmp_path / "certs", binary).parent
    model = world["model"]

    config = tmp_path / "llama-server.sh"

    def check(*said: str, expect: str = "fail", folder: Path = certs) -> None:
        engine = f"{binary} -m {model} {OK_FLAGS}"
        config.write_text(f"exec {served(engine, folder)}\n")
        code = gate(config, folder)
        assert_decision(code, capsys.readouterr().out, expect, *said)

    check(f"build by sha256 of {binary} and its 1 llama.cpp libraries", expect="pass")
    _other_build(library)
    check(f"llama.cpp library {LIBRARY} has sha256 {sha256_file(library)[:12]}... (measured "
          f"{measured[:12]}...)")  # fmt: skip
    library.write_bytes(original)
    (binary.parent / BACKEND).symlink_to(LIBRARY)
    check(f"llama.cpp library {BACKEND} (sha256 {measured[:12]}...) is beside the server binary")
    (binary.parent / BACKEND).unlink()
    old = _cert(world, tmp_path / "old", binary, libraries=None).parent
    check(f"the cert records no llama.cpp libraries and the server binary loads {LIBRARY}",
          folder=old)  # fmt: skip
    # A library that cannot be read here: not covered, and the file is named.
    (binary.parent / BACKEND).symlink_to("gone.so")
    check(
        "cannot tell whether it measured this deploy: "
        f"llama.cpp library {binary.parent / BACKEND} of {binary} cannot be read (No such file "
        "or directory): the build's llama.cpp libraries cannot be checked"
    )


def test_serve_starts_a_build_that_picks_its_cpu_kernels_only_on_the_measured_cpu_features(
    world: World, tmp_path: Path
) -> None:
    """ggml built in CPU variants loads one at start by the CPU's SIMD features: the cert's
    host must have had this CPU's features, or another variant runs."""
    binary = gcc_build(tmp_path / "build")
    shutil.copyfile(binary.parent / LIBRARY, binary.parent / BACKEND)
    here = cpu_flags()

    def on(name: str, flags: list[str] | None) -> Any:  # serve a cert measured on that CPU
        host = None if flags is None else {"cpu_flags": flags}
        return _serve(_cert(world, tmp_path / name, binary, host))

    _served(on("same", here))
    other = [*here[:-1], "amx_int8"] if here else ["avx2"]
    _refused(
        on("other", other),
        f"this build picks its CPU kernels at start by the CPU's features ({BACKEND}, ...): "
        f"the cert measured a CPU with {' '.join(other)}, this one has {' '.join(here) or 'none'}"
        ": measure the cell on this CPU",
    )  # fmt: skip
    _refused(
        on("unrecorded", None),
        "and the cert records none of its host's: re-measure on this CPU",
    )  # fmt: skip
    # Without CPU variants the kernels are in the build's bytes: the CPU's features pick none.
    (binary.parent / BACKEND).unlink()
    _served(on("fixed", other))


def test_a_cpu_variant_is_told_by_its_file_name_only() -> None:
    found = BuildLibraries(sha256=((LIBRARY, "a"), ("libggml-cpu.so", "b")))
    assert cpu_variant_problem(found, None, ["avx2"]) is None  # one CPU backend: no choice
    found = BuildLibraries(sha256=((LIBRARY, "a"), ("lib/libggml-cpu-zen4.so", "b")))
    assert cpu_variant_problem(found, {"cpu_flags": ["avx2"]}, ["avx2"]) is None
    assert "measure the cell on this CPU" in str(
        cpu_variant_problem(found, {"cpu_flags": ["avx2"]}, ["avx2", "avx512f"])
    )
    assert cpu_variant_problem(None, None, []) is None  # no ELF file: no libraries
