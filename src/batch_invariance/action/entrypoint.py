"""The GitHub Action's entrypoint: ``python -m batch_invariance.action``.

It reads the step's inputs from ``INPUT_*`` (:mod:`batch_invariance.action.inputs`), builds the
same typed request the CLI builds, checks it once into the job (``prepare``) and calls the same
service (``run_live_cell`` / ``run_mock_cell``) with the same driver and core, then:

* writes the outputs to ``$GITHUB_OUTPUT`` (:mod:`batch_invariance.action.outputs`);
* appends a Markdown job summary to ``$GITHUB_STEP_SUMMARY``
  (:mod:`batch_invariance.report.render`), every value from an input or the cert escaped as
  Markdown text;
* prints ``::error::`` / ``::notice::`` annotations, their values escaped as the runner
  unescapes them, and plain log lines on which no value can start a workflow command;
* signs the cert with sigstore when ``sign`` is true;
* with a ``baseline``, verifies it before the run, compares the new cert with it after, writes
  the comparison beside the cert and adds its table to the summary
  (:mod:`batch_invariance.action.baseline`);
* exits 0 only when the ``require`` check holds (``green``: :func:`cert_is_green`,
  ``promotable``: :func:`is_promotable`, ``cert``: a cert was written, whatever its verdict,
  for a caller that gates on the cert) and, with a baseline, ``fail-on`` passes, so the job
  status is the verdict (under ``cert``, the caller's). A mock cert (``source=mock``) can
  never pass.

Infrastructure and configuration failures end with their own annotation and exit code and
no verdict outputs; a signing failure after a measured cell is its own failure too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from batch_invariance import exitcodes
from batch_invariance.action.baseline import (
    BaselineResult,
    LoadedBaseline,
    compare_run,
    load_baseline,
)
from batch_invariance.action.failure import StepTrace, debug_outputs
from batch_invariance.action.inputs import (
    ActionInputs,
    check_folders,
    check_server_pair,
    live_request,
    mock_request,
    read_inputs,
)
from batch_invariance.action.lookup import check_input_files
from batch_invariance.action.outputs import (
    OUTPUT_NAMES,
    append_runner_file,
    format_outputs,
    outputs_for,
    require_holds,
)
from batch_invariance.cert.attestation import attest_file
from batch_invariance.cert.signing import (
    BundleSigner,
    SigstoreSigner,
    detect_token,
    sign_file,
)
from batch_invariance.errors import (
    BatchInvarianceError,
    CertInvalid,
    GuardRefused,
    InfraError,
    Interrupted,
)
from batch_invariance.interrupts import sigterm_raises
from batch_invariance.report.compare_render import comparison_markdown, worst_words
from batch_invariance.report.render import (
    TITLE,
    annotation,
    failure_summary,
    log_line,
    summary_markdown,
    verdict_annotation,
)
from batch_invariance.run.progress import Progress
from batch_invariance.service.dry_run import is_ladder, ladder_line
from batch_invariance.service.finish import FinishedCell
from batch_invariance.service.live import LiveCell, prepare, run_live_cell
from batch_invariance.service.mock_cell import mock_ladder, run_mock_cell
from batch_invariance.service.reach import cannot_be_green, planned_workset

Provisioner = Callable[[], tuple[Path, Path]]


def embedded_default() -> tuple[Path, Path]:
    """Provision the embedded default (real llama-server + Gemma 3 270M) and return it."""
    from batch_invariance.provision.embedded import provision

    got = provision()
    # Said in the job log: whether this job paid for the build (built or adopted) or found it
    # in the cache a runner keeps between jobs (reused).
    print(
        log_line(
            f"batch-invariance: embedded default: llama-server {got.server_origin}, model "
            f"{got.model_origin}, in {got.server_bin.parents[3]}"
        ),
        file=sys.stderr,
        flush=True,
    )
    return got.server_bin, got.model


def run_cell_for(
    inputs: ActionInputs,
    provisioner: Provisioner,
    out: TextIO | None = None,
    *,
    env: Mapping[str, str] | None = None,
    trace: StepTrace | None = None,
) -> FinishedCell:
    """Run the cell the inputs ask for through the same service as the CLI (``trace`` keeps
    the prepared job for a failure's artifact; ``env`` holds the runner's folders)."""
    if inputs.mode == "mock":
        request = mock_request(inputs)
        if request.workset is None:
            ladder = ladder_line(mock_ladder(request), request.ctx)
            print(log_line(f"batch-invariance: plan: {ladder}"), file=out or sys.stdout, flush=True)
        return run_mock_cell(request, progress=Progress())
    check_folders(inputs)
    check_server_pair(inputs)
    check_input_files(inputs, env or {})
    # As run-live's shell prefix sets them: every server inherits this process's variables.
    os.environ.update(inputs.engine_env)
    embedded = provisioner() if not inputs.profile and not inputs.server_bin else None
    job = prepare(live_request(inputs, embedded))
    if trace is not None:
        trace.job = job
    refuse_unreachable(job, inputs.require, out or sys.stdout)
    return run_live_cell(job, progress=Progress()).finished


def refuse_unreachable(job: LiveCell, require: str, out: TextIO) -> None:
    """The plan step: say what the cell measures, and refuse before any server starts a plan
    that can never be GREEN, unless ``require`` is ``none`` (with a baseline, it asks for no
    verdict). Under ``cert`` the job would pass, but the caller gating on the cert could only
    fail the cell: refusing saves the run."""
    workset = planned_workset(job)
    if workset is not None and is_ladder(workset):
        plan = f"batch-invariance: plan: {ladder_line(workset, job.ctx)}"
        print(log_line(plan), file=out, flush=True)
    if job.endpoint is not None and job.endpoint.why is not None:
        # The endpoint input left at auto: which endpoint it chose, and why.
        print(log_line(f"batch-invariance: plan: {job.endpoint.line()}"), file=out, flush=True)
    causes = cannot_be_green(job) if require != "none" else ()
    if causes:
        more = f" (and {len(causes) - 1} more: {'; '.join(causes[1:])})" if causes[1:] else ""
        # Under cert the job itself would pass; the gate on its cert never could.
        never = (
            "require: cert: a gate on this cert can never pass"
            if require == "cert"
            else f"require: {require} can never hold"
        )
        raise GuardRefused(f"{never}, this plan cannot reach GREEN: {causes[0]}{more}")


def _failure_title(exc: BatchInvarianceError) -> str:
    if isinstance(exc, InfraError):
        return f"{TITLE} infrastructure failure (no verdict)"
    if isinstance(exc, GuardRefused):
        return f"{TITLE} refused to launch (no verdict)"
    if isinstance(exc, CertInvalid):
        return f"{TITLE} cert invalid"
    if isinstance(exc, Interrupted):
        return f"{TITLE} interrupted (no verdict)"
    return f"{TITLE} configuration error (no verdict)"


def _fail(
    exc: BatchInvarianceError, env: Mapping[str, str], out: TextIO, title: str | None = None
) -> int:
    heading = title or _failure_title(exc)
    print(annotation("error", heading, str(exc)), file=out)
    # Best effort: the annotation above already carries the error.
    with contextlib.suppress(BatchInvarianceError):
        append_runner_file(env.get("GITHUB_STEP_SUMMARY"), failure_summary(heading, exc))
    return exitcodes.for_error(exc)


@dataclass(frozen=True)
class _Signing:
    """What signing the cert gave: its bundle, or the error that stopped it (cert kept)."""

    bundle: Path | None = None
    error: BatchInvarianceError | None = None


def run_action(
    env: Mapping[str, str],
    *,
    signer: BundleSigner | None = None,
    out: TextIO | None = None,
    provisioner: Provisioner = embedded_default,
) -> int:
    """Run the Action against ``env`` and return the process exit code."""
    stream = out if out is not None else sys.stdout
    trace = StepTrace(started=time.time())
    inputs: ActionInputs | None = None
    try:
        inputs = read_inputs(env)
        if inputs.sign:
            # Fail before a long GPU run when the job cannot sign anyway.
            try:
                detect_token(None)
            except BatchInvarianceError as exc:
                return _fail(exc, env, stream, title=f"{TITLE} signing impossible (no run)")
        # Verified (signature included) before the cell runs: a bad baseline costs no run.
        baseline = load_baseline(inputs.baseline, inputs.workspace, inputs.out_dir, env)
        _announce(inputs, stream)
        finished = run_cell_for(inputs, provisioner, stream, env=env, trace=trace)
    except BatchInvarianceError as exc:
        _leave_debug_files(inputs, trace, env)
        return _fail(exc, env, stream)
    except KeyboardInterrupt:
        _leave_debug_files(inputs, trace, env)
        return _fail(Interrupted(int(signal.SIGINT)), env, stream)
    return _report(finished, inputs, baseline, env, stream, signer, trace)


def _leave_debug_files(
    inputs: ActionInputs | None, trace: StepTrace, env: Mapping[str, str]
) -> None:
    """A step that ended without a verdict: the plan and the server logs for the artifact
    (``debug-paths``, ``cell-id``), best effort. Nothing when the inputs could not be read."""
    if inputs is None:
        return
    with contextlib.suppress(BatchInvarianceError):
        append_runner_file(
            env.get("GITHUB_OUTPUT"), format_outputs(debug_outputs(inputs, trace, env))
        )


def _announce(inputs: ActionInputs, stream: TextIO) -> None:
    """The notices for inputs mock mode ignores, and the line that names the cell."""
    for name in inputs.ignored():
        print(annotation("notice", TITLE, f"input {name} is ignored in mock mode"), file=stream)
    print(
        f"batch-invariance: {inputs.mode} cell ctx={inputs.ctx} N={inputs.parallel}",
        file=stream,
        flush=True,
    )


def _sign(finished: FinishedCell, sign: bool, signer: BundleSigner | None) -> _Signing:
    """Sign and attest the cert where ``sign`` asks; a failure is kept, not raised."""
    if not sign:
        return _Signing()
    try:
        token = detect_token(None)
        real_signer = signer or SigstoreSigner()
        bundle = sign_file(finished.path, token, real_signer).bundle
        attest_file(finished.path, token, real_signer)
    except BatchInvarianceError as exc:
        return _Signing(error=exc)
    return _Signing(bundle=bundle)


def _report(
    finished: FinishedCell,
    inputs: ActionInputs,
    baseline: LoadedBaseline | None,
    env: Mapping[str, str],
    stream: TextIO,
    signer: BundleSigner | None,
    trace: StepTrace | None = None,
) -> int:
    """After the cell: sign, compare with the baseline, write the outputs and the summary,
    print the annotations, and return the exit code. A step that does not pass also hands
    its plan and server logs to the upload (``debug-paths``)."""
    cert = finished.cert
    signing = _sign(finished, inputs.sign, signer)
    passed = require_holds(cert, inputs.require)
    against: BaselineResult | None = None
    summary = ""
    try:
        if baseline is not None:
            against = compare_run(baseline, cert, finished.path)
            summary = "\n" + comparison_markdown(against.comparison, against.fail_on)
    except BatchInvarianceError as exc:
        return _fail(exc, env, stream, title=f"{TITLE} comparison with the baseline failed")
    outputs = outputs_for(
        cert,
        finished.path,
        signing.bundle,
        inputs.workspace,
        None if against is None else against.path,
        None if against is None else against.comparison.worst() or "none",
    )
    failing = signing.error is not None or not passed or bool(against and against.failures)
    if failing and trace is not None:
        found = debug_outputs(inputs, trace, env, stem=finished.path.stem)
        outputs["debug-paths"] = found["debug-paths"]
    print(verdict_annotation(cert, inputs.require, passed, outputs["cell"]), file=stream)
    if against is not None:
        print(baseline_annotation(against), file=stream)
    try:
        append_runner_file(env.get("GITHUB_OUTPUT"), format_outputs(outputs))
        append_runner_file(
            env.get("GITHUB_STEP_SUMMARY"),
            summary_markdown(cert, inputs.require, passed, outputs) + summary,
        )
    except BatchInvarianceError as exc:
        # The cert is written (and signed); only the report to the runner failed.
        return _fail(exc, env, stream)
    for name in OUTPUT_NAMES:
        print(log_line(f"{name}: {outputs[name]}"), file=stream)
    return _exit_code(finished, passed, against, signing, env, stream)


def _exit_code(
    finished: FinishedCell,
    passed: bool,
    against: BaselineResult | None,
    signing: _Signing,
    env: Mapping[str, str],
    stream: TextIO,
) -> int:
    """A signing failure first, then the ``require`` check, then the baseline's ``fail-on``."""
    if signing.error is not None:
        return _fail(
            signing.error, env, stream, title=f"{TITLE} signing failed (cert kept, not signed)"
        )
    if not passed:
        return exitcodes.for_status(str(finished.cert.status), promotable=False)
    if against is not None and against.failures:
        return exitcodes.for_policy(against.comparison.comparable, failed=True)
    return exitcodes.PROMOTABLE


def baseline_annotation(result: BaselineResult) -> str:
    """The ``::error::`` / ``::notice::`` line for the comparison with the baseline."""
    title = f"{TITLE} against the baseline"
    worst = worst_words(result.comparison.worst())
    if result.failures:
        more = f" (and {len(result.failures) - 1} more)" if len(result.failures) > 1 else ""
        return annotation(
            "error", title, f"fail-on {result.fail_on}: {result.failures[0]}{more}; worst: {worst}"
        )
    return annotation("notice", title, f"fail-on {result.fail_on} passes; worst: {worst}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entrypoint of the Docker action and of the reusable workflow's step."""
    if argv:
        print("batch-invariance action takes its inputs from INPUT_* variables", file=sys.stderr)
        return exitcodes.USAGE
    with sigterm_raises():
        return run_action(os.environ)
