"""check-deploy in CI through cli.main: ``--json`` prints the outcome as one object (the human
lines on stderr); in a GitHub job each problem is an ``::error`` annotation on its line."""

# ruff: noqa: F811 (the world fixture, imported)
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batch_invariance import exitcodes
from tests.support.deploy_world import OK_FLAGS, Capsys, World, gate, path_line, served, world  # noqa: F401

NO = exitcodes.NOT_PROMOTABLE
TITLE = "title=batch-invariance check-deploy"


def _deploy(world: World, folder: Path, body: str) -> Path:
    config = folder / "deploy" / "llm.sh"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(path_line(world["binary"]) + body)
    return config


def _json(world: World, config: Path, capsys: Capsys, code: int = NO) -> dict[str, Any]:
    assert gate(config, world["certs"], "--json") == code
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def _failing(world: World) -> str:
    """Line 2 starts serve with N=8, a cell no cert measured."""
    engine = f"llama-server -m {world['model']} -c 8192 -np 8"
    return f"exec {served(engine, world['certs'])}\n"


def test_json_prints_the_outcome_alone_on_stdout(
    world: World, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    config = _deploy(world, tmp_path, _failing(world))
    assert gate(config, world["certs"]) == NO
    plain = capsys.readouterr()
    assert gate(config, world["certs"], "--json") == NO
    out, err = capsys.readouterr()
    data: dict[str, Any] = json.loads(out)
    assert out == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert err == plain.out  # the human lines, moved to stderr
    assert (data["command"], data["decision"], data["exit_code"]) == ("check-deploy", "fail", 3)
    assert [(c["result"], c["parallel"]) for c in data["cells"]] == [("fail", 8)]
    (problem,) = data["cells"][0]["problems"]
    assert (problem["file"], problem["line"], problem["rule"]) == (str(config), 2, "missing")
    assert data["summary"] == plain.out.splitlines()[-1]
    # A pass, and the same server started directly: covered, never a pass.
    engine = f"llama-server -m {world['model']} {OK_FLAGS}"
    data = _json(world, _deploy(world, tmp_path, f"exec {served(engine, world['certs'])}\n"),
                 capsys, exitcodes.PROMOTABLE)  # fmt: skip
    assert (data["decision"], data["exit_code"], data["signatures_checked"]) == ("pass", 0, False)
    ((cell,), green) = data["cells"], str(world["green"])
    assert (cell["kind"], cell["result"], cell["cert"]) == ("ok", "pass", green)
    data = _json(world, _deploy(world, tmp_path, f"exec {engine}\n"), capsys)
    assert (data["decision"], data["exit_code"]) == ("fail", NO)
    (cell,) = data["cells"]
    assert (cell["kind"], cell["result"], cell["cert"]) == ("raw", "fail", str(world["green"]))
    assert f"(cert {world['green'].name} covers this cell)" in cell["reason"]
    assert cell["problems"][0]["rule"] == "raw"


def test_a_github_job_gets_one_annotation_per_problem_on_its_line(
    world: World, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    for body, head, said in [
        (_failing(world), "", "N=8 kv=split: no cert"),
        ("curl -o /tmp/x https://example.com\n" + _failing(world), "not understood: ", "runs curl"),
    ]:
        config = _deploy(world, tmp_path, body)
        monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
        assert gate(config, world["certs"]) == NO
        plain = capsys.readouterr().out
        assert "::error" not in plain  # outside a GitHub job nothing changes
        monkeypatch.setenv("GITHUB_ACTIONS", "true")
        assert gate(config, world["certs"]) == NO
        out = capsys.readouterr().out
        assert out.startswith(plain)  # the same text, then the annotations
        (annotation,) = out[len(plain) :].splitlines()
        assert annotation.startswith(f"::error file=deploy/llm.sh,line=2,{TITLE}::{head}")
        assert said in annotation, annotation
    # With --json the annotations go to stderr; outside the workspace the path stays as given.
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path / "elsewhere"))
    assert gate(config, world["certs"], "--json") == NO
    out, err = capsys.readouterr()
    json.loads(out)
    assert err.splitlines()[-1].startswith(f"::error file={str(config).replace(':', '%3A')},")


@pytest.mark.parametrize(
    ("engine", "kind", "words"),
    [
        ("llama-server -m /srv/nowhere/{name} {ok}", "unverifiable",
         ("{agrees}", "not found here: its identity")),
        ("/srv/nowhere/llama-server -m {model} {ok}", "unverifiable",
         ("{agrees}", "not found here: its build (sha256) cannot")),
        # With the model file absent only its name ties a cert to the cell: a cert of another
        # model is not named as the one found.
        ("llama-server -m /srv/nowhere/other.gguf {ok}", "missing",
         ("(no cert measured this cell (",)),
    ],
    ids=["model-not-here", "binary-not-here", "other-model-not-here"],
)  # fmt: skip
def test_a_cert_found_but_not_checkable_here_is_unverifiable_and_named(
    world: World, tmp_path: Path, capsys: Capsys, engine: str, kind: str, words: tuple[str, ...]
) -> None:
    """The kind says the identity could not be checked here: not ``missing``, whose fix (run
    the cell) would not help. Started directly: kind raw, the coverage's reason kept inside."""
    green = world["green"]
    cert = str(green) if kind == "unverifiable" else None
    agrees = f"cert {green.name} agrees on everything checkable here"
    engine = engine.format(name=world["model"].name, model=world["model"], ok=OK_FLAGS)
    words = tuple(word.format(agrees=agrees) for word in words)
    config = _deploy(world, tmp_path, f"exec {served(engine, world['certs'])}\n")
    (found,) = _json(world, config, capsys)["cells"]
    assert (found["kind"], found["result"], found["cert"]) == (kind, "fail", cert)
    assert found["problems"][0]["rule"] == kind
    assert kind == "missing" or all(word in found["reason"] for word in words)
    (raw,) = _json(world, _deploy(world, tmp_path, f"{engine}\n"), capsys)["cells"]
    assert (raw["kind"], raw["result"], raw["cert"]) == ("raw", "fail", cert)
    assert all(word in raw["reason"] for word in words) and "covers this cell" not in raw["reason"]
