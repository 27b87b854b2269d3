"""The deploy gate's test world: real cert files of real cells, deploy files that start them,
and a fake bundle verifier that applies the signer policy.

The promotable certs have their verdict decided by the core from the factories' green evidence;
``source`` is ``live`` (no live GREEN can be earned in a unit test) and the provenance records
the llama-server argv and the model file and binary (in tmp) a live run of that cell records.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.signature import BundlePolicy, SignerPolicy, TrustRoot
from batch_invariance.cert.signing_policy import signing_policy
from batch_invariance.cli import build_parser, main
from batch_invariance.core.evidence import GatePolicy
from batch_invariance.errors import CertInvalid
from batch_invariance.gate.check import BundleVerifier
from tests.support.paths import SHARED_FIXTURES

MODEL = "gemma-3-270m-q4_k_m"
SIGSTORE = SHARED_FIXTURES / "sigstore"
MEASURED_FLAGS = ("-ub", "1")
#: The prompt cache off, as the cold arms measured it (deploy/prompt_cache.py).
CACHE_OFF = "--no-cache-prompt --cache-ram 0"
OK_FLAGS = f"-c 4096 -np 4 -ub 1 {CACHE_OFF}"
#: The annotations of the fixtures every deploy test takes.
World = dict[str, Path]
Capsys = pytest.CaptureFixture[str]
#: This tool's own launcher: check-deploy reads a serve line only when it starts this tool.
TOOL = Path(sys.executable).with_name("batch-invariance")


def server_argv(model: Path, parallel: int, layout: str, **kw: Any) -> list[str]:
    """The argv run-live's server of this cell runs (``kw``: ``build_argv``'s own options)."""
    from batch_invariance.engines.llama_server.engine import build_argv

    return list(
        build_argv(Path("/opt/llama-server"), model, host="127.0.0.1", port=1, parallel=parallel,
                   ctx=1024, extra_flags=MEASURED_FLAGS, kv_layout=layout, **kw)  # type: ignore[arg-type]
    )  # fmt: skip


def _provenance(
    model: Path, parallel: int, layout: str, binary: Path | None = None
) -> dict[str, Any]:
    """What run-live records for this cell: the model file, the server binary (by default
    ``bin/`` beside the model's folder, with llama.cpp's libraries beside an ELF build) and the
    A / BC servers' argv."""
    from batch_invariance.engines.llama_server.linked import own_libraries
    from batch_invariance.host.facts import cpu_flags, sha256_file

    data = model.read_bytes()
    binary = binary or model.parent.parent / "bin" / "llama-server"
    server_binary: dict[str, Any] = {"path": str(binary), "sha256": sha256_file(binary)}
    libraries = own_libraries(binary, sha256_file)
    if libraries is not None and libraries.unread is None:
        server_binary["libraries"] = [{"path": n, "sha256": h} for n, h in libraries.sha256]
    servers = [("A", server_argv(model, 1, "split")), ("BC", server_argv(model, parallel, layout))]
    return {
        "driver": "run-live",
        "server_binary": server_binary,
        "servers": [{"role": role, "argv": argv} for role, argv in servers],
        "model_file": {
            "path": str(model),
            "name": model.name,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
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
    cache_arm: bool = False,
    reach: int | None = None,
) -> Path:
    """A GREEN live cert of (MODEL, ``ctx``, N ``parallel``) whose provenance agrees with its
    cell, its sequences filling the slot (``slot_ctx=None``: a cert written before the slot
    was recorded; ``short``: 12-token prompts that do not; ``cache_arm``: with the prompt
    cache arm's pass, and its hits; ``reach``: sequences climbing to 9/10 of that many tokens
    instead, as a unified pool's ladder reaches past the slot into the pool)."""
    from batch_invariance.cert.certificate import build_cert
    from batch_invariance.cert.store import write_cert
    from batch_invariance.core.evidence import CellSpec
    from batch_invariance.core.verdict import decide
    from batch_invariance.engines.llama_server.engine import kv_label
    from tests.support.factories import TS, concurrent_pass, green_evidence

    evidence = green_evidence(slot_ctx=None if short else slot_ctx)
    if short:  # the factory's 12-token prompts, in a recorded slot
        evidence = replace(evidence, slot_ctx=slot_ctx)
    if reach is not None:  # sequences to 9/10 of the pool, judged against the slot
        evidence = replace(green_evidence(slot_ctx=reach), slot_ctx=slot_ctx)
    if cache_arm:
        prompts = {t: x.prompt_tokens_measured or 0 for t, x in evidence.a.items()}
        base = concurrent_pass(list(evidence.a), 0, prompts=prompts)
        trials = {t: replace(x, timings={"cache_n": 40.0}) for t, x in base.trials.items()}
        evidence = replace(evidence, cache_passes=(replace(base, trials=trials),))
    label = kv_label(ctx, parallel, layout)  # type: ignore[arg-type]
    cell = CellSpec(model=MODEL, ctx=ctx, dispatch_n=parallel, kv_label=label, reps=1, is_moe=False)
    provenance = provenance or _provenance(model, parallel, layout)
    chosen = policy or GatePolicy()
    verdict = decide(evidence, chosen)
    cert = build_cert(evidence, verdict, cell, chosen, provenance, "live", TS)
    assert not cache_arm or cert.prompt_cache is not None, verdict.decision_reasons
    return write_cert(out_dir, cert).path


#: The mock cell every ``world`` copies: one driver run for the session, not one per module.
_MOCK_CELLS: list[Path] = []


def _shared_mock_cell(factory: pytest.TempPathFactory) -> Path:
    """The folder of one real driver run (N 2) against the loopback mock (never promotable)."""
    from importlib import resources

    from batch_invariance.cert.provenance import Provenance
    from batch_invariance.core.evidence import CellSpec
    from batch_invariance.core.plan import Measurement
    from batch_invariance.mock import MockKnobs, MockLauncher
    from batch_invariance.run.cell import CellPlan, run_cell
    from batch_invariance.run.workset import load_workset
    from batch_invariance.scorer_api import load_scorer
    from batch_invariance.service.finish import finish_cell

    if not _MOCK_CELLS:
        folder = factory.mktemp("mock-cell")
        with resources.as_file(
            resources.files("batch_invariance") / "data/worksets/mock.json"
        ) as p:
            workset = load_workset(p)
        plan = CellPlan(items=workset.items, ctx=1024, parallel=2,
                        measurement=Measurement(gate_passes=4, n_predict=128))  # fmt: skip
        run = run_cell(plan, MockLauncher(MockKnobs()), load_scorer(None))
        spec = CellSpec(model=MODEL, ctx=1024, dispatch_n=2, kv_label=run.kv_label, reps=1)
        finish_cell(run, spec, GatePolicy(), Provenance(driver="deploy-test"), folder)
        _MOCK_CELLS.append(folder)
    return _MOCK_CELLS[0]


def gguf_bytes(fill: bytes) -> bytes:
    """A GGUF v3 header with no tensors and no metadata, then ``fill`` bytes (no split)."""
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + fill * 4096


def deploy_files(root: Path) -> tuple[Path, Path]:
    """The model file and server binary a cell is measured on: ``root/models``, ``root/bin``."""
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
    """The line a deploy script sets its ``PATH`` with, so a bare ``llama-server`` is ``binary``."""
    return f"export PATH={binary.parent}:/usr/bin:/bin\n"


def served(engine: str, certs: Path, *options: str) -> str:
    """``engine`` started the way that can pass (issue 40): ``batch-invariance serve --certs
    CERTS [OPTIONS] -- ENGINE``, by default with ``--allow-unsigned`` (the unsigned gate's)."""
    assert TOOL.is_file(), "the package's launcher (pip install -e .)"
    return f"{TOOL} serve --certs {certs} {' '.join(options or ('--allow-unsigned',))} -- {engine}"


def assert_covered_raw(code: int, out: str) -> None:
    """A direct launch of a covered cell: never a pass (issue 40), kind ``raw``, exit 3, the
    covering cert named with the serve line."""
    assert code == exitcodes.NOT_PROMOTABLE, out
    assert "check-deploy: PASS" not in out
    assert "directly, which is never a pass" in out, out
    assert "covers this cell); start it as: batch-invariance serve --certs " in out, out


def assert_not_passed(code: int, out: str, *reasons: str) -> None:
    """Exit 3, no pass, no cert said to cover the cell, and each reason in the output."""
    assert code == exitcodes.NOT_PROMOTABLE, out
    assert "check-deploy: PASS" not in out and "covers this cell" not in out, out
    for reason in reasons:
        assert reason in out, f"{reason!r} not in {out!r}"


def _check(
    world: dict[str, Path],
    tmp_path: Path,
    body: str,
    *extra: str,
    certs: Path | None = None,
    name: str | None = None,
) -> int:
    """check-deploy of ``body`` written as a script (after its PATH line), a unit (a body that
    starts with ``[``) or, given ``name``, that file as written."""
    unit = body.startswith("[")  # a unit is read as a unit by its name, as systemd reads it
    config = tmp_path / (name or ("llama-server.service" if unit else "llama-server.sh"))
    if not unit and name is None:  # after a #! line, which the kernel reads on line 1 only
        head, _, rest = body.partition("\n") if body.startswith("#!") else ("", "", body)
        body = (f"{head}\n" if head else "") + path_line(world["binary"]) + rest
    config.write_text(body)
    return main(["check-deploy", str(config), "--certs", str(certs or world["certs"]), *extra])


def gate(config: Path, certs: Path, *extra: str) -> int:
    """check-deploy of ``config`` against ``certs``, unsigned."""
    return main(["check-deploy", str(config), "--certs", str(certs), "--allow-unsigned", *extra])


def _unsigned(world: dict[str, Path], tmp_path: Path, body: str, *extra: str, **kw: Any) -> int:
    return _check(world, tmp_path, body, "--allow-unsigned", *extra, **kw)


def policy_from(*flags: str) -> BundlePolicy | None:
    """The signing policy check-deploy's flags give."""
    args = build_parser().parse_args(["check-deploy", "d.sh", "--certs", ".", *flags])
    policy: BundlePolicy | None = signing_policy(args)
    return policy


def signed_by(signer: Callable[[Path], tuple[str, str]]) -> BundleVerifier:
    """A bundle check that applies the signer policy to the (SAN, repository) ``signer`` says
    each cert file was signed with."""

    def verify(artifact: Path, bundle: Path, wanted: SignerPolicy, trust: TrustRoot) -> None:
        assert bundle.is_file() and trust.offline
        san, repository = signer(artifact)
        pattern = wanted.identity if wanted.identity_is_regexp else re.escape(wanted.identity)
        if re.fullmatch(pattern, san) is None:
            raise CertInvalid(f"signature identity mismatch: signed by {san}")
        if wanted.repository and wanted.repository != repository:
            raise CertInvalid(f"signature repository mismatch: signed for {repository}")

    return verify


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sigstore's offline trust root writes under a writable HOME."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)


def case_fields(world: dict[str, Path], tmp_path: Path) -> dict[str, Any]:
    """What a deploy case's template may name: the world's files and flags, a model of the same
    name from another vendor, another build, a folder all may write, and the answer lengths."""
    other = tmp_path / "other-vendor" / f"{MODEL}.gguf"
    other.parent.mkdir(exist_ok=True)
    other.write_bytes(gguf_bytes(b"\x02"))
    other_bin = tmp_path / "other-build" / "llama-server"
    other_bin.parent.mkdir(exist_ok=True)
    other_bin.write_bytes(b"\x7fELF another build")
    (tmp_path / "open").mkdir(exist_ok=True)
    (tmp_path / "open").chmod(0o1777)
    longest = json.loads(world["green"].read_text())["promotion_scope"]["answer_tokens_max"]
    return {"m": world["model"], "name": world["model"].name, "ok": OK_FLAGS, "off": CACHE_OFF,
            "binary": world["binary"], "certs": world["certs"], "toolbin": TOOL.parent,
            "serve": f"{TOOL} serve --certs {world['certs']} --allow-unsigned --",
            "other": other, "other_bin": other_bin, "open": tmp_path / "open",
            "longest": longest, "over": longest + 1,
            "sha": hashlib.sha256(world["binary"].read_bytes()).hexdigest()[:12],
            "other_sha": hashlib.sha256(other_bin.read_bytes()).hexdigest()[:12]}  # fmt: skip


def assert_decision(code: int, out: str, expect: str, *words: str) -> None:
    """``expect`` is ``pass``, ``raw`` (covered but started directly) or ``fail``; each word
    is in ``out``, or with a leading ``!`` is not."""
    if expect == "raw":
        assert_covered_raw(code, out)
    passed = out.strip().splitlines()[-1].startswith("check-deploy: PASS")
    assert (code, passed) == ((0, True) if expect == "pass" else (3, False)), out
    for word in words:
        assert (word[1:] not in out) if word.startswith("!") else (word in out), (word, out)
