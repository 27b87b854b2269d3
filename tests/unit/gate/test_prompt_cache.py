"""check-deploy and serve on the prompt cache: a deploy whose server caches prompts is covered
only by a cert that measured that caching; one that turns it off passes on today's certs."""

# ruff: noqa: F811 (the world fixture, imported)
from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_invariance.cert.provenance import Provenance
from batch_invariance.engines.base import PromptCache
from batch_invariance.engines.llama_server.flags import read_flags
from batch_invariance.gate.prompt_cache import (
    cache_differences,
    prompt_cache_use,
    serving_argv,
)
from tests.support.deploy_world import (  # noqa: F401 (the fixture)
    Capsys,
    World,
    _live_cert,
    _provenance,
    _unsigned,
    assert_decision,
    served,
    server_argv,
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


def _cache_cert(folder: Path, model: Path) -> Path:
    """A promotable GREEN cert of the world's cell that also measured the prompt cache."""
    provenance = _provenance(model, 4, "split")
    argv = server_argv(model, 4, "split", prompt_cache=PromptCache(None))
    provenance["servers"].append({"role": "cache", "argv": argv})
    return _live_cert(folder, model, provenance=provenance, cache_arm=True)


CASES = [  # the certs (cold: the world's, warm: the cache cert), the deploy, the decision
    ("cold", DEFAULT_DEPLOY, "fail", (
        "caches prompts (--cache-prompt on (llama-server's default), --cache-ram 8192",
        "--no-cache-prompt --cache-ram 0", "run-live --cache-arm", "!covers this cell")),
    ("cold", CACHE_OFF, "raw", ()),
    ("warm", DEFAULT_DEPLOY, "raw", ()),
    ("warm", CACHE_OFF, "raw", ()),
    # A cache setting it did not measure is not covered, and says which.
    ("warm", f"{DEFAULT_DEPLOY} --cache-ram 1024", "fail",
     ("--cache-ram 1024 (measured 8192)", "--cache-arm")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("certs", "deploy", "expect", "words"),
    CASES,
    ids=["cold-default", "cold-cache-off", "warm-default", "warm-cache-off", "warm-cache-ram"],
)
def test_a_deploy_is_covered_only_for_the_cache_its_cert_measured(
    world: World, tmp_path: Path, capsys: Capsys, certs: str, deploy: str, expect: str,
    words: tuple[str, ...]
) -> None:  # fmt: skip
    """Started directly and through serve (which passes where the direct launch is covered)."""
    folder = world["certs"] if certs == "cold" else tmp_path / "warm"
    if certs == "warm":
        _cache_cert(folder, world["model"])
    engine = f"llama-server -m {world['model']} {deploy}"
    code = _unsigned(world, tmp_path, f"{engine}\n", certs=folder)
    assert_decision(code, capsys.readouterr().out, expect, *words)
    code = _unsigned(world, tmp_path, f"exec {served(engine, folder)}\n", certs=folder)
    expect = "pass" if expect == "raw" else "fail"
    assert_decision(code, capsys.readouterr().out, expect, *words[:1])


def test_serve_runs_the_cache_as_the_cert_measured_it(world: World, tmp_path: Path) -> None:
    cold = json.loads(world["green"].read_text())["provenance"]
    bc = next(s for s in cold["servers"] if s["role"] == "BC")["argv"]
    assert serving_argv(Provenance.from_record(cold), bc) == (*bc, "--no-cache-prompt")
    warm = json.loads(_cache_cert(tmp_path / "c", world["model"]).read_text())["provenance"]
    cached = server_argv(world["model"], 4, "split", prompt_cache=PromptCache(None))
    assert serving_argv(Provenance.from_record(warm), bc) == tuple(cached)
