"""check-deploy in CI through cli.main: ``--json`` prints the outcome as one object (the
human lines on stderr), and in a GitHub job each problem is an ``::error`` annotation on the
deploy file's line; outside a job the output is what it always was. A server the deploy
starts directly is never a pass (issue 40): its cell is kind ``raw``, with the reason the
coverage found kept inside."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from tests.unit.deploy.test_check_deploy import (  # noqa: F401 (the fixture)
    OK_FLAGS,
    path_line,
    served,
    world,
)

TITLE = "title=batch-invariance check-deploy"


def _deploy(world: dict[str, Path], folder: Path, body: str) -> Path:  # noqa: F811
    config = folder / "deploy" / "llm.sh"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(path_line(world["binary"]) + body)
    return config


def _argv(world: dict[str, Path], config: Path, *extra: str) -> list[str]:  # noqa: F811
    return ["check-deploy", str(config), "--certs", str(world["certs"]), "--allow-unsigned", *extra]


def _failing(world: dict[str, Path]) -> str:  # noqa: F811
    """Line 2 starts serve with N=8, a cell no cert measured."""
    m, certs = world["model"], world["certs"]
    return f"exec {served(f'llama-server -m {m} -c 8192 -np 8', certs)}\n"


def test_json_prints_the_outcome_alone_on_stdout(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    config = _deploy(world, tmp_path, _failing(world))
    assert main(_argv(world, config)) == exitcodes.NOT_PROMOTABLE
    plain = capsys.readouterr()
    assert main(_argv(world, config, "--json")) == exitcodes.NOT_PROMOTABLE
    out, err = capsys.readouterr()
    data: dict[str, Any] = json.loads(out)
    assert out == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert err == plain.out  # the human lines, moved to stderr
    assert (data["command"], data["decision"], data["exit_code"]) == ("check-deploy", "fail", 3)
    assert [(c["result"], c["parallel"]) for c in data["cells"]] == [("fail", 8)]
    (problem,) = data["cells"][0]["problems"]
    assert (problem["file"], problem["line"], problem["rule"]) == (str(config), 2, "missing")
    assert data["summary"] == plain.out.splitlines()[-1]


def test_json_of_a_deploy_that_passes(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine = f"llama-server -m {world['model']} {OK_FLAGS}"
    config = _deploy(world, tmp_path, f"exec {served(engine, world['certs'])}\n")
    assert main(_argv(world, config, "--json")) == exitcodes.PROMOTABLE
    data = json.loads(capsys.readouterr().out)
    assert (data["decision"], data["exit_code"], data["signatures_checked"]) == ("pass", 0, False)
    assert data["cells"][0]["cert"] == str(world["green"])
    assert (data["cells"][0]["kind"], data["cells"][0]["result"]) == ("ok", "pass")
    # The same server started directly: covered, never a pass.
    config = _deploy(world, tmp_path, f"exec {engine}\n")
    assert main(_argv(world, config, "--json")) == exitcodes.NOT_PROMOTABLE
    data = json.loads(capsys.readouterr().out)
    assert (data["decision"], data["exit_code"]) == ("fail", exitcodes.NOT_PROMOTABLE)
    (cell,) = data["cells"]
    assert (cell["kind"], cell["result"], cell["cert"]) == ("raw", "fail", str(world["green"]))
    assert f"(cert {world['green'].name} covers this cell)" in cell["reason"]
    assert cell["problems"][0]["rule"] == "raw"


def test_a_github_job_gets_one_annotation_per_problem_on_its_line(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _deploy(world, tmp_path, "curl -o /tmp/x https://example.com\n" + _failing(world))
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    assert main(_argv(world, config)) == exitcodes.NOT_PROMOTABLE
    plain = capsys.readouterr().out
    assert "::error" not in plain  # outside a GitHub job nothing changes
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    assert main(_argv(world, config)) == exitcodes.NOT_PROMOTABLE
    out = capsys.readouterr().out
    assert out.startswith(plain)  # the same text, then the annotations
    (annotation,) = out[len(plain) :].splitlines()
    assert annotation.startswith(f"::error file=deploy/llm.sh,line=2,{TITLE}::not understood: ")
    assert "runs curl" in annotation


def test_a_failing_cell_is_annotated_and_json_keeps_stdout_for_the_object(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _deploy(world, tmp_path, _failing(world))
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    assert main(_argv(world, config)) == exitcodes.NOT_PROMOTABLE
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(f"::error file=deploy/llm.sh,line=2,{TITLE}::")
    assert "N=8 kv=split: no cert" in lines[-1]
    # Outside the workspace the path stays as given.
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path / "elsewhere"))
    assert main(_argv(world, config, "--json")) == exitcodes.NOT_PROMOTABLE
    out, err = capsys.readouterr()
    json.loads(out)
    assert err.splitlines()[-1].startswith(f"::error file={str(config).replace(':', '%3A')},")


@pytest.mark.parametrize(
    ("server", "model", "gap"),
    [
        ("llama-server", "/srv/nowhere/{name}", "not found here: its identity"),
        ("/srv/nowhere/llama-server", "{model}", "not found here: its build (sha256) cannot"),
    ],
    ids=["model-not-here", "binary-not-here"],
)
def test_a_cert_found_but_not_checkable_here_is_unverifiable_and_named(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    server: str,
    model: str,
    gap: str,
) -> None:
    """The cert that agrees on every checkable thing is named, and the kind says the
    identity could not be checked on this machine: not ``missing``, whose fix (run the cell)
    would not help; a cell no cert measured stays ``missing`` beside it."""
    m = model.format(name=world["model"].name, model=world["model"])
    engine = f"{server} -m {m} {OK_FLAGS}"
    config = _deploy(world, tmp_path, f"exec {served(engine, world['certs'])}\n")
    assert main(_argv(world, config, "--json")) == exitcodes.NOT_PROMOTABLE
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    (found,) = data["cells"]
    assert (found["kind"], found["result"], found["cert"]) == (
        "unverifiable", "fail", str(world["green"]),
    )  # fmt: skip
    assert found["problems"][0]["rule"] == "unverifiable"
    agrees = f"cert {world['green'].name} agrees on everything checkable here"
    assert agrees in found["reason"] and gap in found["reason"]
    # Started directly: kind raw, the coverage reason kept inside.
    config = _deploy(world, tmp_path, f"{engine}\n")
    assert main(_argv(world, config, "--json")) == exitcodes.NOT_PROMOTABLE
    (raw,) = json.loads(capsys.readouterr().out)["cells"]
    assert (raw["kind"], raw["result"], raw["cert"]) == ("raw", "fail", str(world["green"]))
    assert agrees in raw["reason"] and gap in raw["reason"]
    assert "covers this cell" not in raw["reason"]


def test_a_model_not_here_is_not_matched_to_another_models_cert(
    world: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With the model file absent only its name ties a cert to the cell: a cert of another
    model is not named as the one found."""
    engine = f"llama-server -m /srv/nowhere/other.gguf {OK_FLAGS}"
    config = _deploy(world, tmp_path, f"exec {served(engine, world['certs'])}\n")
    assert main(_argv(world, config, "--json")) == exitcodes.NOT_PROMOTABLE
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert (cell["kind"], cell["cert"]) == ("missing", None)
    config = _deploy(world, tmp_path, f"exec {engine}\n")
    assert main(_argv(world, config, "--json")) == exitcodes.NOT_PROMOTABLE
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert (cell["kind"], cell["cert"]) == ("raw", None)
    assert "(no cert measured this cell (" in cell["reason"]
    assert "covers this cell" not in cell["reason"]
