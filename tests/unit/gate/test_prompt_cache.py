"""check-deploy and serve on the prompt cache: a deploy whose server caches prompts is covered
only by a cert that measured that caching; one that turns it off passes on today's certs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.provenance import Provenance
from batch_invariance.engines.base import PromptCache
from batch_invariance.engines.llama_server.engine import build_argv
from batch_invariance.engines.llama_server.flags import read_flags
from batch_invariance.gate.prompt_cache import (
    cache_differences,
    prompt_cache_use,
    serving_argv,
)
from tests.support.factories import cert_for, concurrent_pass, green_evidence
from tests.unit.deploy.test_check_deploy import (  # noqa: F401  (the module's fixture)
    MEASURED_FLAGS,
    MODEL,
    _provenance,
    _unsigned,
    assert_covered_raw,
    served,
    world,
)

DEFAULT_DEPLOY = "-c 4096 -np 4 -ub 1"
CACHE_OFF = f"{DEFAULT_DEPLOY} --no-cache-prompt --cache-ram 0"


def flags(text: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return read_flags(text.split(), first_is_binary=False, env=env or {})


@pytest.mark.parametrize(
    ("deploy", "caches"),
    [
        ("", ("--cache-prompt on (llama-server's default)",
              "--cache-ram 8192 (llama-server's default)")),
        ("--no-cache-prompt --cache-ram 0", ()),
        ("--cache-ram 0", ("--cache-prompt on (llama-server's default)",)),
        ("--no-cache-prompt", ("--cache-ram 8192 (llama-server's default)",)),
        ("--no-cache-prompt --cache-ram 0 --cache-reuse 256", ("--cache-reuse 256",)),
        ("--no-cache-prompt -cram 0 --slot-save-path /srv/slots", ("--slot-save-path /srv/slots",)),
        ("--cache-prompt --cache-ram -1", ("--cache-prompt on", "--cache-ram -1")),
    ],
)  # fmt: skip
def test_which_servers_cache_prompts(deploy: str, caches: tuple[str, ...]) -> None:
    assert prompt_cache_use(flags(deploy)).why == caches


def test_the_variables_llama_server_reads_count_too() -> None:
    env = {"LLAMA_ARG_CACHE_PROMPT": "false", "LLAMA_ARG_CACHE_RAM": "0"}
    assert not prompt_cache_use(flags("", env)).caches


def test_rule_without_a_measured_cache_names_both_ways_out() -> None:
    (problem,) = cache_differences(flags(""), None)
    assert "measured traffic with the prompt cache off only" in problem
    assert "--no-cache-prompt --cache-ram 0" in problem and "--cache-arm" in problem
    assert cache_differences(flags("--no-cache-prompt --cache-ram 0"), None) == ()


def _cache_argv(model: Path, cache_ram: int | None = None) -> list[str]:
    return list(
        build_argv(Path("/opt/llama-server"), model, host="127.0.0.1", port=1, parallel=4,
                   ctx=1024, extra_flags=MEASURED_FLAGS, prompt_cache=PromptCache(cache_ram))
    )  # fmt: skip


def _cache_cert(folder: Path, model: Path, cache_ram: int | None = None) -> Path:
    """A promotable GREEN cert of the world's cell that also measured the prompt cache."""
    from batch_invariance.cert.store import write_cert
    from batch_invariance.core.evidence import CellSpec
    from batch_invariance.engines.llama_server.engine import kv_label

    green = green_evidence(slot_ctx=1024)
    prompts = {t: x.prompt_tokens_measured or 0 for t, x in green.a.items()}
    base = concurrent_pass(list(green.a), 0, prompts=prompts)
    trials = {t: replace(x, timings={"cache_n": 40.0}) for t, x in base.trials.items()}
    evidence = replace(green, cache_passes=(replace(base, trials=trials),))
    provenance = _provenance(model, 4, "split")
    provenance["servers"].append({"role": "cache", "argv": _cache_argv(model, cache_ram)})
    cell = CellSpec(model=MODEL, ctx=1024, dispatch_n=4, kv_label=kv_label(1024, 4, "split"),
                    reps=1, is_moe=False)  # fmt: skip
    cert, verdict = cert_for(evidence, cell=cell, extra_provenance=provenance)
    assert cert.status == "green" and cert.prompt_cache is not None, verdict.decision_reasons
    return write_cert(folder, cert).path


def test_default_cache_deploy_on_a_cache_off_cert_is_refused_with_the_fix(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    body = f"llama-server -m {world['model']} {DEFAULT_DEPLOY}\n"
    assert _unsigned(world, tmp_path, body) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert "caches prompts (--cache-prompt on (llama-server's default), --cache-ram 8192" in out
    assert "--no-cache-prompt --cache-ram 0" in out and "run-live --cache-arm" in out
    assert "covers this cell" not in out
    engine = f"llama-server -m {world['model']} {DEFAULT_DEPLOY}"
    code = _unsigned(world, tmp_path, f"exec {served(engine, world['certs'])}\n")
    out = capsys.readouterr().out
    assert code == exitcodes.NOT_PROMOTABLE and "check-deploy: PASS" not in out
    assert "caches prompts (--cache-prompt on" in out
    engine = f"llama-server -m {world['model']} {CACHE_OFF}"
    assert_covered_raw(_unsigned(world, tmp_path, f"{engine}\n"), capsys.readouterr().out)
    assert _unsigned(world, tmp_path, f"exec {served(engine, world['certs'])}\n") == 0


def test_a_cache_on_cert_covers_the_default_deploy_and_the_cache_off_one(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    certs = tmp_path / "cache-certs"
    _cache_cert(certs, world["model"])
    for deploy in (DEFAULT_DEPLOY, CACHE_OFF):
        engine = f"llama-server -m {world['model']} {deploy}"
        code = _unsigned(world, tmp_path, f"{engine}\n", certs=certs)
        assert_covered_raw(code, capsys.readouterr().out)
        code = _unsigned(world, tmp_path, f"exec {served(engine, certs)}\n", certs=certs)
        out = capsys.readouterr().out
        assert code == exitcodes.PROMOTABLE, (deploy, out)
    # A cache setting it did not measure is not covered, and says which.
    body = f"llama-server -m {world['model']} {DEFAULT_DEPLOY} --cache-ram 1024\n"
    assert _unsigned(world, tmp_path, body, certs=certs) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert "--cache-ram 1024 (measured 8192)" in out and "--cache-arm" in out


def test_serve_runs_the_cache_as_the_cert_measured_it(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    cold = json.loads(world["green"].read_text())["provenance"]
    bc = next(s for s in cold["servers"] if s["role"] == "BC")["argv"]
    assert serving_argv(Provenance.from_record(cold), bc) == (*bc, "--no-cache-prompt")
    warm = json.loads(_cache_cert(tmp_path / "c", world["model"]).read_text())["provenance"]
    assert serving_argv(Provenance.from_record(warm), bc) == tuple(_cache_argv(world["model"]))
