"""`check-deploy` against real cert files: a cert covers exactly the cell it measured.

The promotable certs come from real driver runs against the loopback mock with the verdict
really decided by the core. Two things are set by this fixture: ``source`` is ``live`` (the
driver takes it from the launcher; no live GREEN can be earned in a unit test), and the
provenance records the llama-server argv and model file a live run of that cell records
(``build_argv``'s argv with ``-ub 1``, a model file in tmp). Every reproducer of issue 12 §4 is
a test below.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.provenance import Provenance
from batch_invariance.cert.signature import (
    BundlePolicy,
    SignerPolicy,
    TrustRoot,
    verify_bundle,
)
from batch_invariance.cert.signing import (
    GITHUB_ACTIONS_ISSUER,
)
from batch_invariance.cert.signing_policy import signing_policy
from batch_invariance.cli import build_parser, main
from batch_invariance.core.evidence import GatePolicy
from batch_invariance.core.plan import Measurement
from batch_invariance.deploy.deploy_report import check_cells, load_deploy_cells
from batch_invariance.errors import CertInvalid, UsageError
from batch_invariance.gate.check import BundleVerifier
from tests.support.paths import SHARED_FIXTURES

MODEL = "gemma-3-270m-q4_k_m"
SIGSTORE = SHARED_FIXTURES / "sigstore"
MEASURED_FLAGS = ("-ub", "1")
#: The prompt cache off, as the cold arms measured it (deploy/prompt_cache.py).
CACHE_OFF = "--no-cache-prompt --cache-ram 0"
OK_FLAGS = f"-c 4096 -np 4 -ub 1 {CACHE_OFF}"


def _provenance(
    model: Path, parallel: int, layout: str, binary: Path | None = None
) -> dict[str, Any]:
    """What run-live records for this cell: the model file, the server binary (by default
    ``bin/`` beside the model's folder; llama.cpp's libraries beside a real ELF build too) and
    the A / BC servers' argv."""
    from batch_invariance.engines.llama_server.engine import build_argv
    from batch_invariance.engines.llama_server.linked import own_libraries
    from batch_invariance.host.facts import cpu_flags, sha256_file

    def argv(n: int, kv: str) -> list[str]:
        return list(
            build_argv(Path("/opt/llama-server"), model, host="127.0.0.1", port=1, parallel=n,
                       ctx=1024, extra_flags=MEASURED_FLAGS, kv_layout=kv)  # type: ignore[arg-type]
        )  # fmt: skip

    data = model.read_bytes()
    binary = binary or model.parent.parent / "bin" / "llama-server"
    server_binary: dict[str, Any] = {
        "path": str(binary),
        "sha256": hashlib.sha256(binary.read_bytes()).hexdigest(),
    }
    libraries = own_libraries(binary, sha256_file)
    if libraries is not None and libraries.unread is None:
        server_binary["libraries"] = [{"path": n, "sha256": h} for n, h in libraries.sha256]
    return {
        "driver": "run-live",
        "server_binary": server_binary,
        "servers": [
            {"role": "A", "argv": argv(1, "split")},
            {"role": "BC", "argv": argv(parallel, layout)},
        ],
        "model_file": {
            "path": str(model),
            "name": model.name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        },
        "plan": {"n_predict": 128},
        "host": {"cpu_flags": cpu_flags()},
    }


def _live_cert(
    out_dir: Path,
    model: Path,
    *,
    layout: str = "split",
    policy: GatePolicy | None = None,
    provenance: dict[str, Any] | None = None,
    slot_ctx: int | None = 1024,
    short: bool = False,
    parallel: int = 4,
    ctx: int = 1024,
) -> Path:
    """A GREEN live cert of (MODEL, ``ctx``, N ``parallel``) whose provenance agrees with its
    cell; the verdict is decided by the core from the factories' green evidence, whose
    sequences fill the slot (``slot_ctx=None``: a cert written before the slot was recorded;
    ``short``: 12-token prompts that do not)."""
    from batch_invariance.cert.certificate import build_cert
    from batch_invariance.cert.store import write_cert
    from batch_invariance.core.evidence import CellSpec
    from batch_invariance.core.verdict import decide
    from batch_invariance.engines.llama_server.engine import kv_label
    from tests.support.factories import green_evidence

    chosen = policy or GatePolicy()
    evidence = green_evidence(slot_ctx=None if short else slot_ctx)
    if short:  # the factory's 12-token prompts, in a recorded slot
        evidence = replace(evidence, slot_ctx=slot_ctx)
    label = kv_label(ctx, parallel, layout)  # type: ignore[arg-type]
    cell = CellSpec(model=MODEL, ctx=ctx, dispatch_n=parallel, kv_label=label, reps=1, is_moe=False)
    provenance = provenance or _provenance(model, parallel, layout)
    cert = build_cert(evidence, decide(evidence, chosen), cell, chosen, provenance, "live",
                      "2025-01-02T03:04:05Z")  # fmt: skip
    return write_cert(out_dir, cert).path


def _mock_cell(out_dir: Path, parallel: int) -> Path:
    """A real driver run against the loopback mock (source mock: never promotable)."""
    from importlib import resources

    from batch_invariance.core.evidence import CellSpec
    from batch_invariance.mock import MockKnobs, MockLauncher
    from batch_invariance.run.cell import CellPlan, run_cell
    from batch_invariance.run.workset import load_workset
    from batch_invariance.scorer_api import load_scorer
    from batch_invariance.service.finish import finish_cell

    ref = resources.files("batch_invariance").joinpath("data/worksets/mock.json")
    with resources.as_file(ref) as path:
        workset = load_workset(path)
    plan = CellPlan(
        items=workset.items,
        ctx=1024,
        parallel=parallel,
        measurement=Measurement(gate_passes=4, n_predict=128),
    )
    run = run_cell(plan, MockLauncher(MockKnobs()), load_scorer(None))
    spec = CellSpec(model=MODEL, ctx=1024, dispatch_n=parallel, kv_label=run.kv_label, reps=1)
    return finish_cell(run, spec, GatePolicy(), Provenance(driver="deploy-test"), out_dir).path


#: The mock cell every ``world`` copies: one driver run for the session, not one per module
#: that imports the fixture (ten of them). Its cert records no path of the module's world.
_MOCK_CELLS: list[Path] = []


def _shared_mock_cell(factory: pytest.TempPathFactory) -> Path:
    """The folder of one real mock run (N 2); each ``world`` copies it, so a module that
    edits its copy changes nobody else's."""
    if not _MOCK_CELLS:
        folder = factory.mktemp("mock-cell")
        _mock_cell(folder, 2)
        _MOCK_CELLS.append(folder)
    return _MOCK_CELLS[0]


def gguf_bytes(fill: bytes) -> bytes:
    """A GGUF v3 header with no tensors and no metadata, then ``fill`` bytes: a model file
    whose header reads (one file, not a split), with no weights."""
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + fill * 4096


def deploy_files(root: Path) -> tuple[Path, Path]:
    """The model file and the server binary a cell is measured on: ``root/models`` and
    ``root/bin`` (where :func:`_provenance` looks for the binary)."""
    model = root / "models" / f"{MODEL}.gguf"
    model.parent.mkdir()
    model.write_bytes(gguf_bytes(b"\x01"))
    binary = root / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_bytes(b"\x7fELF measured build")
    binary.chmod(0o755)
    return model, binary


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A model file, a server binary on PATH, a promotable split cert (ctx 1024, N 4, -ub 1),
    a mock cert (N 2) and, in its own folder, a promotable unified-KV cert of the same cell."""
    root = tmp_path_factory.mktemp("deploy")
    model, binary = deploy_files(root)
    certs = root / "certs"
    green = _live_cert(certs, model)
    assert json.loads(green.read_text())["status"] == "green"
    shutil.copytree(_shared_mock_cell(tmp_path_factory), certs / "mock")
    unified = root / "unified"
    _live_cert(unified, model, layout="unified")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{binary.parent}:{os.environ.get('PATH', '')}")
        yield {"root": root, "model": model, "certs": certs, "unified": unified,
               "green": green, "binary": binary}  # fmt: skip


def path_line(binary: Path) -> str:
    """The line a deploy script sets its ``PATH`` with, so that a bare ``llama-server`` is
    the measured binary (a script that sets none leaves it to the caller's ``PATH``)."""
    return f"export PATH={binary.parent}:/usr/bin:/bin\n"


#: This tool's own launcher: check-deploy reads a serve line only when it starts this tool.
TOOL = Path(sys.executable).with_name("batch-invariance")


def served(engine: str, certs: Path, *options: str) -> str:
    """``engine`` (a llama-server command line, as a deploy writes it) started the way that can
    pass (issue 40): ``batch-invariance serve --certs CERTS [OPTIONS] -- ENGINE``, by default
    with ``--allow-unsigned``, as the unsigned gate of these tests checks it."""
    assert TOOL.is_file(), "the package's launcher (pip install -e .)"
    return f"{TOOL} serve --certs {certs} {' '.join(options or ('--allow-unsigned',))} -- {engine}"


def suggested(engine: str, certs: Path) -> str:
    """The serve line check-deploy prints for a server the deploy starts directly, with the
    gate's own signing policy (these tests run the gate with --allow-unsigned)."""
    return f"start it as: batch-invariance serve --certs {certs} --allow-unsigned -- {engine}"


def assert_covered_raw(code: int, out: str) -> None:
    """A deploy that starts llama-server directly, on a cell a cert covers: never a pass (issue
    40), kind ``raw``, exit 3; the cert that covers the cell is named with the serve line."""
    assert code == exitcodes.NOT_PROMOTABLE, out
    assert "check-deploy: PASS" not in out
    assert "directly, which is never a pass" in out, out
    assert "covers this cell); start it as: batch-invariance serve --certs " in out, out


def assert_raw_not_covered(code: int, out: str, *reasons: str) -> None:
    """A direct launch on a cell no cert covers: the coverage reasons are kept in the raw
    reason, and no cert is said to cover it."""
    assert code == exitcodes.NOT_PROMOTABLE, out
    assert "check-deploy: PASS" not in out and "covers this cell" not in out, out
    for reason in reasons:
        assert reason in out, f"{reason!r} not in {out!r}"


def _check(
    world: dict[str, Path], tmp_path: Path, body: str, *extra: str, certs: Path | None = None
) -> int:
    unit = body.startswith("[")  # a unit is read as a unit by its name, as systemd reads it
    config = tmp_path / ("llama-server.service" if unit else "llama-server.sh")
    if not unit:  # the PATH line goes after a #! line, which the kernel reads on line 1 only
        head, _, rest = body.partition("\n") if body.startswith("#!") else ("", "", body)
        body = (f"{head}\n" if head else "") + path_line(world["binary"]) + rest
    config.write_text(body)
    folder = certs or world["certs"]
    return main(["check-deploy", str(config), "--certs", str(folder), *extra])


def _unsigned(world: dict[str, Path], tmp_path: Path, body: str, **kw: Any) -> int:
    return _check(world, tmp_path, body, "--allow-unsigned", **kw)


def test_passes_when_every_batched_cell_is_covered(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = world["model"]
    # A second launch in one script is refused (a deploy starts serve once, as the one thing
    # that runs), even a serial one that needs no cert.
    serial = f"llama-server -m {m} -c 1024 -np 1\n"
    body = serial + f"exec {served(f'llama-server -m {m} {OK_FLAGS}', world['certs'])}\n"
    assert _unsigned(world, tmp_path, body) == exitcodes.NOT_PROMOTABLE
    assert ":3: not understood: a second launch" in capsys.readouterr().out
    assert _unsigned(world, tmp_path, serial) == exitcodes.PROMOTABLE
    assert "parallel 1: no batching" in capsys.readouterr().out
    body = f"exec {served(f'llama-server -m {m} {OK_FLAGS}', world['certs'])}\n"
    assert _unsigned(world, tmp_path, body) == exitcodes.PROMOTABLE
    out = capsys.readouterr().out
    assert f"pass  {MODEL} ctx=1024 N=4 kv=split" in out
    assert "model by sha256" in out
    longest = json.loads(world["green"].read_text())["promotion_scope"]["answer_tokens_max"]
    assert out.strip().splitlines()[-1] == (
        f"check-deploy: PASS: 1 batched cell(s) certified; covers answers up to {longest} "
        "tokens (no -n cap in 1 cell(s): longer answers were never measured) "
        "(UNSIGNED: --allow-unsigned, signatures not checked)"
    )


def test_a_covered_cell_passes_only_started_through_serve(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40: the same deploy passes written as a serve line and never as a direct launch,
    whose output names the cert that covers its cell and the serve line to write instead."""
    certs, engine = world["certs"], f"llama-server -m {world['model']} {OK_FLAGS} -n 64"
    code = _unsigned(world, tmp_path, f"exec {engine}\n")
    raw = capsys.readouterr().out
    assert_covered_raw(code, raw)
    assert (
        f"FAIL  {MODEL} ctx=1024 N=4 kv=split  [llama-server.sh:2]  starts llama-server "
        "directly, which is never a pass: batch-invariance serve proves the cell on the serving "
        f"host at start (cert {world['green'].name} covers this cell); {suggested(engine, certs)}"
    ) in raw
    assert raw.strip().splitlines()[-1].startswith("check-deploy: FAIL: 1 of 1 batched cell(s)")
    config = tmp_path / "llama-server.sh"
    args = ["check-deploy", str(config), "--certs", str(certs), "--allow-unsigned"]
    assert main([*args, "--json"]) == exitcodes.NOT_PROMOTABLE
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert (cell["kind"], cell["result"], cell["cert"]) == ("raw", "fail", str(world["green"]))
    assert cell["problems"][0]["rule"] == "raw"
    # --suggest prints only the serve line of each server started directly.
    assert main([*args, "--suggest"]) == exitcodes.NOT_PROMOTABLE
    line = f"batch-invariance serve --certs {certs} --allow-unsigned -- {engine}"
    assert (
        capsys.readouterr().out == f"# llama-server.sh:2: {MODEL} ctx=1024 N=4 kv=split\n{line}\n"
    )
    # The line it suggests, pasted into the deploy (the tool by its path), passes that gate.
    pasted = f"exec {TOOL}{line.removeprefix('batch-invariance')}\n"
    assert _unsigned(world, tmp_path, pasted) == exitcodes.PROMOTABLE, capsys.readouterr().out
    capsys.readouterr()
    # The same engine command through this tool's serve passes.
    assert _unsigned(world, tmp_path, f"exec {served(engine, certs)}\n") == exitcodes.PROMOTABLE
    out = capsys.readouterr().out
    assert f"pass  {MODEL} ctx=1024 N=4 kv=split  [llama-server.sh:2]  promotable cert" in out
    assert "directly" not in out and out.strip().splitlines()[-1].startswith("check-deploy: PASS")


def test_a_serve_script_passes_with_limits_and_logging_and_nothing_else_around_it(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Resource limits, logging and neutral exports around the one serve line pass; an
    environment that reaches the Python running serve (PYTHON*, LD_*) never does."""
    line = served(f"llama-server -m {world['model']} {OK_FLAGS}", world["certs"])
    ok = (
        "#!/bin/bash\nset -euo pipefail\nulimit -n 65536\numask 027\nexport LANG=C.UTF-8\n"
        "echo starting >>/tmp/llm.log\nexec {} >>/tmp/llm.log 2>&1\n"
    )
    assert _unsigned(world, tmp_path, ok.format(line)) == exitcodes.PROMOTABLE
    capsys.readouterr()
    for around, named in [
        # The refusals of the shell reader are test_readers.py's; these are serve's own.
        ("export PYTHONPATH=/tmp\n{}", "environment PYTHONPATH reaches the Python"),
        ("export LD_PRELOAD=/tmp/x.so\n{}", "environment LD_PRELOAD reaches the Python"),
        ("LD_LIBRARY_PATH=/tmp exec {}", "environment LD_LIBRARY_PATH reaches the Python"),
    ]:
        body = around.format(line)
        assert _unsigned(world, tmp_path, body + "\n") == exitcodes.NOT_PROMOTABLE, body
        out = capsys.readouterr().out
        assert named in out and "check-deploy: PASS" not in out, out


def test_a_serve_launcher_found_on_path_is_held_to_the_folders_before_it(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bare ``batch-invariance`` runs the first one on the file's PATH: a folder before the
    launcher's that others can write (sticky or not) could hold another program later."""
    engine = f"{world['binary']} -m {world['model']} {OK_FLAGS}"
    bare = served(engine, world["certs"]).replace(str(TOOL), "batch-invariance")
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o777)
    open_folder.chmod(0o1777)
    for path, code in [
        (f"{TOOL.parent}:/usr/bin", exitcodes.PROMOTABLE),
        (f"{open_folder}:{TOOL.parent}", exitcodes.NOT_PROMOTABLE),
        (f"bin:{TOOL.parent}", exitcodes.NOT_PROMOTABLE),
    ]:
        body = f"export PATH={path}\nexec {bare}\n"
        assert _unsigned(world, tmp_path, body) == code, capsys.readouterr().out
        out = capsys.readouterr().out
        assert (
            code == exitcodes.PROMOTABLE or "is searched before" in out or "is relative" in out
        ), out


def test_n_from_the_environment_elsewhere_in_the_file(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = (
        f"export LLAMA_ARG_N_PARALLEL=8\nllama-server -m {world['model']} -c 8192 -ub 1 -cram 0\n"
    )
    assert _unsigned(world, tmp_path, body) == exitcodes.NOT_PROMOTABLE
    assert f"FAIL  {MODEL} ctx=1024 N=8 kv=split" in capsys.readouterr().out


def test_systemd_unit_environment(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unit = (
        "[Unit]\nDescription=llama-server\n[Service]\nEnvironment=LLAMA_ARG_N_PARALLEL=16\n"
        f"ExecStart=/usr/bin/llama-server -m {world['model']} -c 16384 -ub 1 {CACHE_OFF}\n"
    )
    assert _unsigned(world, tmp_path, unit) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert f"FAIL  {MODEL} ctx=1024 N=16 kv=split" in out and "1 of 1 batched" in out
    # EnvironmentFile= and the unit's other refusals: test_readers.py.
    covered = f"ExecStart={world['binary']} -m {world['model']} {OK_FLAGS}\n"
    assert_covered_raw(_unsigned(world, tmp_path, "[Service]\n" + covered), capsys.readouterr().out)
    engine = f"{world['binary']} -m {world['model']} {OK_FLAGS}"
    unit = f"[Service]\nExecStart={served(engine, world['certs'])}\n"
    assert _unsigned(world, tmp_path, unit) == exitcodes.PROMOTABLE


@pytest.mark.parametrize(
    "flags",
    [
        "-c 4096 -np 4 -kvu -ub 1 --no-cache-prompt --cache-ram 0",
        "-c 4096 -ub 1 --no-cache-prompt --cache-ram 0",
    ],
    ids=["kvu", "no-np"],
)
def test_unified_kv_is_covered_only_where_the_sequences_reach_the_pool(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: str
) -> None:
    body = f"llama-server -m {world['model']} {flags}\n"
    assert _unsigned(world, tmp_path, body) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert f"FAIL  {MODEL} ctx=1024 N=4 kv=unified" in out
    assert "KV layout unified (measured split)" in out and "covers this cell" not in out
    # Any slot of a unified pool may fill the whole pool (the server's log: n_ctx_slot = the
    # pool; held-out class of issue 40): a unified cert whose sequences reached its 1024-token
    # share does not cover the 4096-token pool, raw or through serve; the line says what to
    # measure.
    code = _unsigned(world, tmp_path, body, certs=world["unified"])
    out = capsys.readouterr().out
    assert code == exitcodes.NOT_PROMOTABLE and "covers this cell" not in out
    assert "but the slot is 4096 tokens (need >= 3072, 3/4 of it)" in out, out
    engine = f"llama-server -m {world['model']} {flags}"
    line = f"exec {served(engine, world['unified'])}\n"
    assert _unsigned(world, tmp_path, line, certs=world["unified"]) == exitcodes.NOT_PROMOTABLE
    assert "the slot is 4096 tokens" in capsys.readouterr().out
    # ... and the unified cert does not cover the split deploy, nor another pool size.
    split = f"llama-server -m {world['model']} {OK_FLAGS}\n"
    assert _unsigned(world, tmp_path, split, certs=world["unified"]) == exitcodes.NOT_PROMOTABLE
    assert "KV layout split (measured unified)" in capsys.readouterr().out


def test_same_file_name_but_another_model_is_not_covered(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other-vendor" / f"{MODEL}.gguf"
    other.parent.mkdir()
    other.write_bytes(gguf_bytes(b"\x02"))
    assert _unsigned(world, tmp_path, f"llama-server -m {other} {OK_FLAGS}\n") == 3
    assert "model sha256" in capsys.readouterr().out
    # A model file that is not here cannot be identified: not covered, never matched by name.
    missing = f"llama-server -m /srv/nowhere/{MODEL}.gguf {OK_FLAGS}\n"
    assert _unsigned(world, tmp_path, missing) == exitcodes.NOT_PROMOTABLE
    assert "not found here: its identity (sha256, or size and name)" in capsys.readouterr().out


def test_a_generation_limit_longer_than_measured_is_not_covered(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = world["model"]
    data = json.loads(world["green"].read_text())
    scope = data.get("promotion_scope") or {}
    longest = scope.get("answer_tokens_max") or data["provenance"]["plan"]["n_predict"]
    too_long = f"-n {longest + 1}: the cert measured answers up to {longest} tokens only"
    over = f"llama-server -m {m} {OK_FLAGS} -n {longest + 1}"
    code = _unsigned(world, tmp_path, f"{over}\n")
    assert_raw_not_covered(code, capsys.readouterr().out, too_long)
    code = _unsigned(world, tmp_path, f"exec {served(over, world['certs'])}\n")
    assert code == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert too_long in out and "check-deploy: PASS" not in out
    body = f"LLAMA_ARG_N_PREDICT={longest + 1} llama-server -m {m} {OK_FLAGS}\n"
    code = _unsigned(world, tmp_path, body)
    assert_raw_not_covered(code, capsys.readouterr().out, f"-n {longest + 1}: the cert measured")
    within = f"llama-server -m {m} {OK_FLAGS} -n {longest}"
    assert_covered_raw(_unsigned(world, tmp_path, f"{within}\n"), capsys.readouterr().out)
    assert _unsigned(world, tmp_path, f"exec {served(within, world['certs'])}\n") == 0


def test_mock_and_tampered_certs_do_not_cover(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = f"llama-server -m {world['model']} -c 2048 -np 2 -ub 1 --no-cache-prompt --cache-ram 0\n"
    assert _unsigned(world, tmp_path, body) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    # A mock run records no model file and a mock server argv: it measured no deploy cell.
    assert f"FAIL  {MODEL} ctx=1024 N=2 kv=split" in out and "no cert measured this cell" in out
    folder = tmp_path / "certs"
    shutil.copytree(world["certs"], folder)
    cert = folder / world["green"].name
    data = json.loads(cert.read_text())
    data["sensitivity"]["n_hot_trials"] += 1000
    cert.write_text(json.dumps(data, sort_keys=True, indent=2))
    ok = f"llama-server -m {world['model']} {OK_FLAGS}"
    assert _unsigned(world, tmp_path, f"exec {served(ok, folder)}\n", certs=folder) == (
        exitcodes.CERT_INVALID
    )
    assert "is invalid" in capsys.readouterr().out
    # Started directly: never a pass, and the reason still names the invalid cert.
    code = _unsigned(world, tmp_path, f"{ok}\n", certs=folder)
    out = capsys.readouterr().out
    assert code != exitcodes.PROMOTABLE and "check-deploy: PASS" not in out
    assert "is invalid" in out and "covers this cell" not in out


def test_a_cert_recorded_under_a_looser_policy_does_not_cover(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "loose"
    _live_cert(folder, world["model"], policy=GatePolicy(min_hot_trials=1))
    body = f"llama-server -m {world['model']} {OK_FLAGS}\n"
    assert _unsigned(world, tmp_path, body, certs=folder) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert "is not promotable (" in out and "min_hot_trials 1" in out


def test_files_that_are_not_certs_are_named_and_skipped(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "certs"
    shutil.copytree(world["certs"], folder)
    (folder / "broken.json").write_text("{")
    nan = json.loads(world["green"].read_text())
    nan["sensitivity"]["rate_upper_bound_95"] = float("nan")
    (folder / "nan.json").write_text(json.dumps(nan))
    (folder / "huge.json").write_text('{"model": "m", "ctx": ' + "9" * 5000 + "}")
    m = world["model"]
    body = f"exec {served(f'llama-server -m {m} -c 8192 -np 8', folder)}\n"
    assert _unsigned(world, tmp_path, body, certs=folder) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert "broken.json (not a readable cert" in out and "nan.json (not a readable cert" in out
    assert "huge.json (not a readable cert" in out


def test_signatures_are_required_by_default(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = f"llama-server -m {world['model']} {OK_FLAGS}\n"
    # No identity policy and no --allow-unsigned: a usage error that says what to add.
    assert _check(world, tmp_path, body) == exitcodes.USAGE
    identity = [
        "--cert-identity",
        "https://github.com/o/r/.github/workflows/c.yml@refs/tags/v1",
        "--cert-oidc-issuer",
        "https://token.actions.githubusercontent.com",
        "--repository",
        "o/deploy",
        "--offline",
    ]
    assert _check(world, tmp_path, body, *identity) == exitcodes.NOT_PROMOTABLE
    assert "is not signed (no " in capsys.readouterr().out
    assert _check(world, tmp_path, body, "--allow-unsigned", *identity[:2]) == exitcodes.USAGE


def test_a_bundle_for_another_file_is_rejected(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = SIGSTORE / "rfc8785-0.1.2-py3-none-any.whl.sigstore.json"
    if not bundle.is_file():
        pytest.skip("the public sigstore fixture is not here")
    folder = tmp_path / "certs"
    shutil.copytree(world["certs"], folder)
    shutil.copy(bundle, folder / (world["green"].name + ".sigstore.json"))
    policy = tmp_path / "signing.toml"
    policy.write_text(
        'identity = "https://github.com/trailofbits/rfc8785.py/.github/workflows/release.yml'
        '@refs/tags/v0.1.2"\nissuer = "https://token.actions.githubusercontent.com"\n'
        'repository = "trailofbits/rfc8785.py"\n'
    )
    args = ("--signing-policy", str(policy), "--offline")
    engine = f"llama-server -m {world['model']} {OK_FLAGS}"
    body = f"exec {served(engine, folder, *args)}\n"
    assert _check(world, tmp_path, body, *args, certs=folder) == exitcodes.CERT_INVALID
    assert "digest mismatch" in capsys.readouterr().out


def test_models_toml_and_usage_errors(
    world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # run-live's registry names no binary and starts no serve: never a deploy (issue 40).
    config = tmp_path / "models.toml"
    config.write_text(f'[[models]]\nalias = "g"\ngguf = "{world["model"]}"\nkv = "f16"\n')
    args = ["check-deploy", str(config), "--certs", str(world["certs"]), "--allow-unsigned"]
    assert main(args) == exitcodes.USAGE
    said = capsys.readouterr()
    assert "models.toml: a .toml file is a model registry, not a deploy" in said.err
    assert "Traceback" not in said.out + said.err
    body = f"llama-server -m {world['model']} {OK_FLAGS}\n"
    assert _unsigned(world, tmp_path, body, certs=tmp_path / "nope") == exitcodes.USAGE
    assert main([*args[:1], str(tmp_path / "missing.sh"), *args[2:]]) == exitcodes.USAGE


TAG_SAN = "https://github.com/addiplus/batch-invariance/.github/workflows/cell.yml@refs/tags/v0.3.1"
TAG_OR_SHA = (
    r"^https://github\.com/addiplus/batch-invariance/\.github/workflows/cell\.yml"
    r"@(refs/tags/v[0-9]+(\.[0-9]+)*|[0-9a-f]{40})$"
)


def _policy_from(*flags: str) -> BundlePolicy | None:
    args = build_parser().parse_args(["check-deploy", "deploy.sh", "--certs", ".", *flags])
    policy: BundlePolicy | None = signing_policy(args)
    return policy


def _signed_by(san: str) -> BundleVerifier:
    """A bundle check that applies the signer policy to a bundle signed by ``san``."""

    def verify(artifact: Path, bundle: Path, wanted: SignerPolicy, trust: TrustRoot) -> None:
        assert bundle.is_file() and trust.offline
        match = (
            re.fullmatch(wanted.identity, san) is not None
            if wanted.identity_is_regexp
            else wanted.identity == san
        )
        if not match:
            raise CertInvalid(f"signature identity mismatch: signed by {san}")

    return verify


@pytest.mark.parametrize(
    ("san", "covered"),
    [
        (TAG_SAN, True),
        (TAG_SAN.replace("refs/tags/v0.3.1", "0123456789abcdef0123456789abcdef01234567"), True),
        (TAG_SAN.replace("refs/tags/v0.3.1", "refs/heads/main"), False),
        (TAG_SAN.replace("addiplus/batch-invariance", "someone/else"), False),
    ],
)
def test_identity_regexp_decides_coverage(
    world: dict[str, Path], tmp_path: Path, san: str, covered: bool
) -> None:
    folder = tmp_path / "certs"
    shutil.copytree(world["certs"], folder)
    (folder / (world["green"].name + ".sigstore.json")).write_text("{}")
    config = tmp_path / "llama-server.sh"
    config.write_text(path_line(world["binary"]) + f"llama-server -m {world['model']} {OK_FLAGS}\n")
    policy = _policy_from(
        "--cert-identity-regexp", TAG_OR_SHA, "--cert-oidc-issuer", GITHUB_ACTIONS_ISSUER,
        "--repository", "o/deploy", "--offline",
    )  # fmt: skip
    assert policy is not None and policy.signer.identity_is_regexp
    cells = load_deploy_cells(config).cells
    report = check_cells(config, cells, folder, policy, _signed_by(san))
    assert report.passed is covered
    if not covered:
        assert [c.kind for c in report.checks] == ["invalid"]
        assert "signature identity mismatch" in report.checks[0].reason
    # The same SAN as an exact --cert-identity is a literal, not a pattern.
    exact = _policy_from(
        "--cert-identity", TAG_OR_SHA, "--cert-oidc-issuer", GITHUB_ACTIONS_ISSUER,
        "--repository", "o/deploy", "--offline",
    )  # fmt: skip
    assert exact is not None and not exact.signer.identity_is_regexp
    assert not check_cells(config, cells, folder, exact, _signed_by(san)).passed


def test_identity_regexp_reaches_sigstore(tmp_path: Path) -> None:
    """The flag's policy, verified by sigstore on a real public bundle (offline)."""
    wheel = SIGSTORE / "rfc8785-0.1.2-py3-none-any.whl"
    if not wheel.is_file():
        pytest.skip("the public sigstore fixture is not here")
    bundle = SIGSTORE / (wheel.name + ".sigstore.json")
    release = r"https://github\.com/trailofbits/rfc8785\.py/\.github/workflows/release\.yml@"
    repository = ("--repository", "trailofbits/rfc8785.py")
    issuer = ("--cert-oidc-issuer", GITHUB_ACTIONS_ISSUER, *repository, "--offline")
    good = _policy_from(
        "--cert-identity-regexp", release + r"(refs/tags/v[0-9.]+|[0-9a-f]{40})", *issuer
    )
    assert good is not None
    verify_bundle(wheel, bundle, good.signer, good.trust)
    bad = _policy_from("--cert-identity-regexp", release + r"[0-9a-f]{40}", *issuer)
    assert bad is not None
    with pytest.raises(CertInvalid, match="signature identity mismatch"):
        verify_bundle(wheel, bundle, bad.signer, bad.trust)


def test_identity_regexp_usage_errors(tmp_path: Path) -> None:
    issuer = ("--cert-oidc-issuer", GITHUB_ACTIONS_ISSUER, "--repository", "o/deploy")
    with pytest.raises(UsageError, match="not a valid regex"):
        _policy_from("--cert-identity-regexp", "(unclosed", *issuer)
    with pytest.raises(UsageError, match="not allowed with"):  # one identity flag or the other
        _policy_from("--cert-identity", TAG_SAN, "--cert-identity-regexp", TAG_OR_SHA, *issuer)
    both = tmp_path / "signing.toml"
    both.write_text(
        f'identity = "{TAG_SAN}"\nidentity_regexp = "x"\nissuer = "{GITHUB_ACTIONS_ISSUER}"\n'
    )
    with pytest.raises(UsageError, match="not both"):
        _policy_from("--signing-policy", str(both))
    from_file = tmp_path / "regexp.toml"
    from_file.write_text(
        f"identity_regexp = '{TAG_OR_SHA}'\nissuer = \"{GITHUB_ACTIONS_ISSUER}\"\n"
        'repository = "o/deploy"\n'
    )
    policy = _policy_from("--signing-policy", str(from_file))
    assert policy is not None and policy.signer == SignerPolicy(
        TAG_OR_SHA, GITHUB_ACTIONS_ISSUER, "o/deploy", identity_is_regexp=True
    )
