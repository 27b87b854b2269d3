"""The Action's ``baseline:`` run by act, offline (tests/act/workflows/baseline.yml): an
identical baseline passes the job, a changed answer fails it, the summary shows the table.

The baseline is the cert the composite workflow's live job wrote (tests/act/
test_composite_action.py), and that cert rebuilt with one prompt of arm A answering otherwise.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.build import build_cert, evidence_from_cert, spec_from_cert
from batch_invariance.cert.store import render
from batch_invariance.core.verdict import decide
from tests.act.act_run import ActRun, ActSetup, run_act
from tests.act.test_composite_action import TIMEOUT_S, _cert_from_artifact, _outputs
from tests.support.factories import changed_answer


@pytest.fixture(scope="module")
def baseline_run(
    act_setup: ActSetup,
    finished_build: dict[str, str],
    composite: ActRun,
    tmp_path_factory: pytest.TempPathFactory,
) -> ActRun:
    out = tmp_path_factory.mktemp("baseline")
    cert = _cert_from_artifact(composite, _outputs(composite, "live"), out)
    name = Path(_outputs(composite, "live")["cert-path"]).name
    baselines = out / "baselines"
    (baselines / "identical").mkdir(parents=True)
    (baselines / "changed").mkdir(parents=True)
    (baselines / "identical" / name).write_text(render(cert))
    ev = evidence_from_cert(cert)
    tid = sorted(ev.a)[0]
    ev = replace(ev, a={**ev.a, tid: changed_answer(ev.a[tid])})
    policy = cert.evidence.policy
    rebuilt = build_cert(ev, decide(ev, policy), spec_from_cert(cert), policy, cert.provenance,
                         cert.source, cert.ts_utc)  # fmt: skip
    (baselines / "changed" / name).write_text(render(rebuilt))
    env = {**finished_build, "BI_ACT_BASELINES": str(baselines)}
    run = run_act(act_setup, "act-baseline.yml", out / "run", TIMEOUT_S, env)
    print(f"\nact: baseline.yml in {run.seconds:.1f} s, exit {run.returncode}")
    return run


def _evidence(run: ActRun, job: str) -> dict[str, str]:
    path = run.evidence / f"{job}.outputs.json"
    assert path.is_file(), run.text[-4000:]
    return {str(k): str(v) for k, v in json.loads(path.read_text()).items()}


def test_identical_baseline_passes_the_job(baseline_run: ActRun) -> None:
    outputs = _evidence(baseline_run, "identical")
    assert outputs["baseline-worst"] == "identical", baseline_run.lines("identical baseline")[
        -3000:
    ]
    assert baseline_run.job_results("identical baseline") == ["success"]
    summary = baseline_run.summary("identical baseline")
    assert "### Against the baseline: pass (fail on `scored`)" in summary
    assert (
        "| cell | verdict | identical | drift | tokens changed | scored changed | worst |"
        in summary
    )
    assert outputs["comparison-path"].endswith(".compare.json")
    files = baseline_run.artifact(outputs["artifact"])
    assert Path(outputs["comparison-path"]).name in files  # uploaded beside the cert


def test_changed_answer_fails_the_job(baseline_run: ActRun) -> None:
    outputs = _evidence(baseline_run, "changed")
    assert outputs["baseline-worst"] == "scored"
    assert baseline_run.job_results("changed answer") == ["failure"]
    assert baseline_run.exit_statuses("changed answer", "bi", "cell") == [
        f"exit status {exitcodes.RED}"
    ]
    summary = baseline_run.summary("changed answer")
    assert "### Against the baseline: FAIL (fail on `scored`)" in summary
    assert "| scored |" in summary


def _seconds(event: dict[str, object]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(event["time"]).replace("Z", "+00:00")).timestamp()


def test_the_second_job_on_the_runner_reuses_the_first_ones_build(baseline_run: ActRun) -> None:
    first, second = baseline_run.lines("identical baseline"), baseline_run.lines("changed answer")
    assert "embedded default: llama-server adopted, model assembled" in first, first[-3000:]
    assert "embedded default: llama-server reused, model reused" in second, second[-3000:]
    # From the container step's start to the plan line: the image is cached, nothing is built.
    events = list(baseline_run.step_events("changed answer", ("bi", "cell")))
    plan = next(e for e in events if "batch-invariance: plan:" in str(e.get("msg", "")))
    waited = _seconds(plan) - _seconds(events[0])
    print(f"\nsecond job: measuring {waited:.1f} s after its container step started")
    assert waited < 60
