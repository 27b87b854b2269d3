"""A real run refuses what its own ``--dry-run`` refuses: a plan that cannot reach GREEN
whatever the server does ends ``run-live``, ``sweep`` and ``demo`` with exit 2 and the very
lines the dry run prints, before any server starts (it once ran for about 19 minutes and
ended UNVERIFIED). Looser gate flags change the plan's gates and let it run, never
promotable; there is no other override.

Nothing real is launched: the fake server binary records any launch in a marker file."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from batch_invariance.commands import demo
from batch_invariance.errors import GuardRefused, PlanUnreachable
from tests.support.fakes_live import LOOSE_GATES, fake_cell_files

REFUSED = "this plan cannot reach GREEN"


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    return fake_cell_files(tmp_path, monkeypatch, rows=5)


def _argv(setup: dict[str, Path], command: str, *extra: str) -> list[str]:
    target = () if command == "demo" else (
        "--server-bin", str(setup["bin"]), "--model", str(setup["model"]),
        "--parallel", "2,4" if command == "sweep" else "4",
    )  # fmt: skip
    return [command, *target, "--ctx", "1024", "--out-dir", str(setup["out"]), *extra]


def _refusal(err: str) -> list[str]:
    return [line for line in err.splitlines() if REFUSED in line]


#: One plan per cause (the fake cell's model is a base model without a chat template).
CAUSES = {
    "too few distinct prompts": ("--workset", "{ws}", "--n-predict", "800"),
    "answer budget under the length gate": ("--n-predict", "16"),
    "a base model on the chat endpoint": ("--endpoint", "chat"),
    "a slot the work-set cannot fill": ("--workset", "{short}"),
}


def _extra(setup: dict[str, Path], cause: str) -> tuple[str, ...]:
    short = setup["ws"].with_name("short.json")
    rows = [{"id": f"q{i}", "prompt": f"Tell me {i}."} for i in range(40)]
    short.write_text(json.dumps(rows))
    return tuple(word.format(ws=setup["ws"], short=short) for word in CAUSES[cause])


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_run_live_refuses_what_its_dry_run_refuses_before_any_launch(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str], cause: str
) -> None:
    extra = _extra(setup, cause)
    assert main(_argv(setup, "run-live", "--dry-run", *extra)) == exitcodes.USAGE
    dry = _refusal(capsys.readouterr().err)
    assert any(cause in line for line in dry), dry
    assert main(_argv(setup, "run-live", *extra)) == exitcodes.USAGE
    err = capsys.readouterr().err
    # The same lines, and nothing else: no server started, no cert written.
    assert err.splitlines() == dry
    assert not setup["marker"].exists()
    assert not list(setup["out"].glob("*.json"))


def test_every_cause_is_named_one_line_each(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    both = ("--n-predict", "16", "--endpoint", "chat")
    assert main(_argv(setup, "run-live", "--dry-run", *both)) == exitcodes.USAGE
    dry = _refusal(capsys.readouterr().err)
    assert main(_argv(setup, "run-live", *both)) == exitcodes.USAGE
    err = capsys.readouterr().err.splitlines()
    assert err == dry and len(err) == 2
    assert all(line.startswith(f"batch-invariance: {REFUSED}: ") for line in err)


def test_sweep_refuses_it_before_arm_a(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_argv(setup, "sweep", "--dry-run", "--n-predict", "16")) == exitcodes.USAGE
    dry = _refusal(capsys.readouterr().err)
    assert len(dry) == 2  # the dry run plans every N; the cause is the same for each
    assert main(_argv(setup, "sweep", "--n-predict", "16")) == exitcodes.USAGE
    assert capsys.readouterr().err.splitlines() == dry[:1]
    assert not setup["marker"].exists()
    assert not (setup["out"] / "sweep.json").exists()


def test_demo_refuses_it_after_provisioning_before_any_launch(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    got = SimpleNamespace(server_bin=setup["bin"], model=setup["model"])
    monkeypatch.setattr(demo, "provision", lambda *a, **k: got)
    assert main(_argv(setup, "demo", "--dry-run", "--n-predict", "16")) == exitcodes.USAGE
    dry = _refusal(capsys.readouterr().err)
    assert main(_argv(setup, "demo", "--n-predict", "16")) == exitcodes.USAGE
    assert capsys.readouterr().err.splitlines() == dry and len(dry) == 1
    assert not setup["marker"].exists()


def test_json_answers_the_refusal_as_an_error(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_argv(setup, "run-live", "--n-predict", "16", "--json")) == exitcodes.USAGE
    data = json.loads(capsys.readouterr().out)
    assert data["error"]["exit_code"] == exitcodes.USAGE
    assert data["error"]["kind"] == "PlanUnreachable"
    assert data["error"]["message"].startswith(f"{REFUSED}: answer budget under the length gate")


def test_looser_gates_are_a_different_plan_and_run(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The gate flags are what a plan is judged by: looser ones pass this check, and what
    they measure is never promotable. No flag skips the check itself."""
    assert main(_argv(setup, "run-live", "--dry-run", "--n-predict", "16", *LOOSE_GATES)) == 0
    assert REFUSED not in capsys.readouterr().err


def test_the_refusal_is_a_guard_refusal() -> None:
    refusal = PlanUnreachable(["one", "two"])
    assert isinstance(refusal, GuardRefused)
    assert exitcodes.for_error(refusal) == exitcodes.USAGE
    assert refusal.lines() == (f"{REFUSED}: one", f"{REFUSED}: two")
    assert str(refusal) == f"{REFUSED}: one; {REFUSED}: two"
