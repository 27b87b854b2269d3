"""run-live / plan-n / provision on the command line: usage errors, --dry-run, plan-n.

Nothing here starts a real server: a fake binary records any launch in a marker file, so a
dry run can prove it launched nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance.cli import main
from batch_invariance.host import memory
from batch_invariance.host.gguf import parse_info
from tests.support.fakes_live import LOOSE_GATES, fake_cell_files


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    return fake_cell_files(tmp_path, monkeypatch, rows=5)


def _argv(s: dict[str, Path], *extra: str) -> list[str]:
    return [
        "run-live",
        "--server-bin", str(s["bin"]),
        "--model", str(s["model"]),
        "--workset", str(s["ws"]),
        "--ctx", "512",
        "--parallel", "4",
        "--out-dir", str(s["out"]),
        *extra,
    ]  # fmt: skip


def test_dry_run_prints_the_plan_and_launches_nothing(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(_argv(setup, "--dry-run", "--server-flag", "-ngl", "--server-flag", "0",
                      "--gate-passes", "3", "--reps", "2"))  # fmt: skip
    printed = capsys.readouterr()
    out = printed.out
    # The plan is printed whole; 5 prompts can never reach GREEN, which it says (exit 2).
    assert code == 2 and "too few distinct prompts: 5" in printed.err
    assert not setup["marker"].exists()
    assert not setup["out"].exists()  # not even the out-dir is created
    assert "server A:" in out and "server BC:" in out
    assert "--parallel 1 --ctx-size 512" in out and "--parallel 4 --ctx-size 2048" in out
    assert "-ngl 0" in out  # dash-valued server flags reach the argv
    # 5 rows x 2 reps = 10 items; A, A', B + 3 passes = 6 sweeps.
    assert "requests: up to 60 = 10 items" in out
    assert "projected" in out and "ETA" in out


def test_dry_run_reports_a_guard_refusal(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(_argv(setup, "--dry-run", "--max-footprint-gb", "0.0001"))
    assert code == 2
    assert "memory guard would refuse" in capsys.readouterr().err
    assert not setup["marker"].exists()


def test_a_real_run_refused_by_the_guard_launches_nothing_and_writes_no_cert(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(_argv(setup, "--max-footprint-gb", "0.0001", *LOOSE_GATES))
    err = capsys.readouterr().err
    assert code == 2
    assert "GuardRefused" in err and "max-footprint-gb" in err
    assert len(err.strip().splitlines()) == 1
    assert not setup["marker"].exists()
    assert list(setup["out"].glob("*.json")) == []


def test_a_bc_server_over_the_cap_is_refused_before_arm_a_starts(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # A cap between the A server's projection and the B/C server's: A alone would fit.
    info = parse_info(setup["model"])
    small = memory.project(info, 32768, 1, ()).total_bytes
    large = memory.project(info, 32768, 4, ()).total_bytes
    assert large > small
    cap_gb = (small + large) / 2 / memory.GIB
    cap = ("--max-footprint-gb", f"{cap_gb:.6f}")
    code = main(_argv(setup, *cap, "--ctx", "32768", *LOOSE_GATES))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "GuardRefused" in err and "--parallel 4" in err
    assert not setup["marker"].exists()  # not even the A server started
    assert list(setup["out"].glob("*.json")) == []


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda a: a[:1] + a[3:], "--server-bin is required"),
        (lambda a: [*a, "--parallel", "1"], "--parallel must be at least 2"),
        (lambda a: [*a, "--server-flag", "--port", "--server-flag", "9"], "conflicts"),
        (lambda a: [*a, "--server-flag=-c"], "conflicts"),
        (lambda a: [*a, "--n-predict", "0"], "--n-predict must be at least 1"),
        (lambda a: [*a, "--reserved-port", "70000"], "not a TCP port"),
        (lambda a: [*a, "--port", "8080"], "reserved"),
        (lambda a: [*a, "--model-alias", "x"], "needs --profile"),
        (lambda a: [*a, "--max-footprint-gb", "-1"], "must be positive"),
        (lambda a: [*a, "--scorer", "os:getcwd"], "cannot be called as fn(text, expected"),
        (lambda a: [*a, "--scorer", "nope_pkg_xyz:S"], "importing nope_pkg_xyz failed"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str], mutate: object, needle: str
) -> None:
    argv = mutate(_argv(setup))  # type: ignore[operator]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert not setup["marker"].exists()


def test_the_removed_cert_source_flag_is_refused(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*_argv(setup), "--cert-source", "live"]) == 2
    assert "unrecognized arguments: --cert-source" in capsys.readouterr().err


def test_eta_follows_model_size_cpus_and_the_plan() -> None:
    from batch_invariance.core.plan import eta_seconds

    weights = int(0.236 * 1024**3)  # 13 ms per token on 2 CPUs
    kw = {"n_predict": 100, "gate_passes": 4, "serial_repeat": True}
    # 2 loads x 5 s + 10 items x 1.3 s x 3 serial arms + 4 passes x 10 x 1.3 s / 2.
    assert eta_seconds(weights, 10, cpus=2, **kw) == pytest.approx(75.0)  # type: ignore[arg-type]
    assert eta_seconds(weights, 10, cpus=4, **kw) == pytest.approx(42.5)  # type: ignore[arg-type]
    assert eta_seconds(2 * weights, 10, cpus=2, **kw) == pytest.approx(140.0)  # type: ignore[arg-type]


def test_missing_files_are_usage_errors(
    setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _argv(setup)
    argv[argv.index("--model") + 1] = str(tmp_path / "nope.gguf")
    assert main(argv) == 2
    assert "no such file" in capsys.readouterr().err
    not_exec = tmp_path / "plain"
    not_exec.write_text("x")
    argv = _argv(setup)
    argv[argv.index("--server-bin") + 1] = str(not_exec)
    assert main(argv) == 2
    assert "not executable" in capsys.readouterr().err


def test_plan_n_lists_every_n_and_launches_nothing(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan-n", "--model", str(setup["model"]), "--ctx", "4096", "--parallel", "3",
                 "--max-footprint-gb", "0.3"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    rows = [ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    # KV grows with n: 18 layers x 512 x 2 bytes x 4096 tokens = 72 MiB per slot.
    kv = [float(r[2].rstrip("Gi")) for r in rows]
    assert kv[0] < kv[1] < kv[2]
    assert rows[0][-1] == "NO"  # weights + overhead alone pass a 0.3 GiB cap
    assert not setup["marker"].exists()


def test_fitted_prompts_must_leave_room_for_the_answer() -> None:
    from batch_invariance.core.plan import WorkItem
    from batch_invariance.errors import UsageError
    from batch_invariance.run.workset import workset_from_items
    from batch_invariance.service.live import check_room_to_answer

    def item(test_id: str, tokens: int | None) -> WorkItem:
        meta = {} if tokens is None else {"calibrated_tokens": tokens}
        return WorkItem(test_id=test_id, prompt="p", messages=None, meta=meta)

    fits = workset_from_items([item("a", 900), item("plain", None)], "t")
    check_room_to_answer(fits, ctx=1024, n_predict=124)  # 900 + 124 == 1024: fits exactly
    tight = workset_from_items([item("a", 900), item("b", 990), item("plain", None)], "t")
    with pytest.raises(UsageError, match=r"2 prompt\(s\) leave no room .* \(largest: b, 990"):
        check_room_to_answer(tight, ctx=1024, n_predict=125)
