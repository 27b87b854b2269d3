"""``run-live --json`` and ``sweep --json``: the certs written, their verdicts and the exit
code as one object on stdout; the banners and the sweep table go to stderr. Run against the
loopback mock (attached) and the vLLM protocol stand-in, never a real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from batch_invariance.commands.replies import refused_cell, run_cell, run_reply
from batch_invariance.commands.reply import reply_text
from batch_invariance.mock import MockKnobs, MockServer
from tests.support.factories import cert_for, changed, green_evidence, replace_trial
from tests.support.fakes_live import LOOSE_GATES
from tests.support.golden import check_golden
from tests.unit.commands.test_run_live_engines import _cell, workset  # noqa: F401 (the fixture)
from tests.unit.commands.test_sweep_engines import _argv, vllm_cell  # noqa: F401 (the fixture)


def _object(out: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(out)
    assert out == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return data


def test_run_live_json_names_the_cert_and_its_verdict(
    workset: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with MockServer(parallel=4, ctx=512, knobs=MockKnobs(cobatch_divergence=True)) as server:
        argv = _cell(workset, tmp_path / "out", "--base-url", server.base_url, "--json",
                     *LOOSE_GATES)  # fmt: skip
        code = main(argv)
    out, err = capsys.readouterr()
    assert code == exitcodes.RED
    data = _object(out)
    assert (data["command"], data["exit_code"], data["promotable"]) == ("run-live", 1, False)
    (cell,) = data["cells"]
    (written,) = (tmp_path / "out").glob("*.json")
    assert cell["cert"] == str(written) and cell["parallel"] == 4
    assert (cell["status"], cell["verdict"], cell["promotable"]) == ("failed", "RED", False)
    assert data["sweep"] is None and data["comparison"] is None
    assert str(written) in err  # the banner, on stderr


def test_sweep_json_names_every_cert(
    vllm_cell: dict[str, Path],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = _argv(vllm_cell, "sweep", "--parallel", "2,4", "--no-serial-repeat", "--json")
    code = main([*argv, *LOOSE_GATES])
    out, err = capsys.readouterr()
    assert code == exitcodes.NOT_PROMOTABLE  # too few comparisons for GREEN
    data = _object(out)
    assert (data["command"], data["exit_code"]) == ("sweep", 3)
    assert data["sweep"] == str(vllm_cell["out"] / "sweep.json")
    summary = json.loads((vllm_cell["out"] / "sweep.json").read_text())
    assert data["max_safe_parallel"] == summary["max_safe_parallel"]
    assert [c["parallel"] for c in data["cells"]] == [2, 4]
    for cell, entry in zip(data["cells"], summary["certs"], strict=True):
        assert cell["cert"] == str(vllm_cell["out"] / entry["file"])
        assert cell["not_run"] is None and cell["verdict"] is not None
    assert "max_safe_parallel" in err  # the sweep table, on stderr


def test_run_live_json_names_the_comparison_with_a_baseline(
    vllm_cell: dict[str, Path],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(_argv(vllm_cell, "run-live", "--parallel", "2", "--no-serial-repeat", *LOOSE_GATES))
    (baseline,) = vllm_cell["out"].glob("*.json")
    capsys.readouterr()
    again = _argv(vllm_cell, "run-live", "--parallel", "2", "--no-serial-repeat", "--json",
                  "--baseline", str(baseline), "--allow-unsigned", *LOOSE_GATES)  # fmt: skip
    again[again.index("--out-dir") + 1] = str(vllm_cell["out"] / "new")
    code = main(again)
    data = _object(capsys.readouterr().out)
    (compared,) = (vllm_cell["out"] / "new").glob("*.compare.json")
    assert data["comparison"] == str(compared) and data["exit_code"] == code


def test_the_run_object_is_golden() -> None:
    """A sweep: N=2 GREEN and promotable, N=4 RED, N=8 refused by the memory guard."""
    green, _ = cert_for()
    ev = green_evidence()
    wrong = changed(ev.c_passes[0].trials["t001"], score=0.0)
    red, _ = cert_for(evidence=replace_trial(ev, "C", "t001", wrong))
    out = Path("out")
    cells = [
        run_cell(2, green, out / "m__ctx2048__N2.json", None, True),
        run_cell(4, red, out / "m__ctx2048__N4.json", out / "m__ctx2048__N4.superseded-1.json",
                 False),
        refused_cell(8, "not run: projected 30.0 GiB > cap 24.0 GiB"),
    ]  # fmt: skip
    reply = run_reply("sweep", cells, exitcodes.RED, sweep=out / "sweep.json", max_safe_parallel=2)
    assert reply.promotable is False
    check_golden("run_reply.json", reply_text(reply))
