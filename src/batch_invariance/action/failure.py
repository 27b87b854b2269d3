"""What a step that did not pass leaves for its artifact: the plan and the server logs.

A failed step (exit 4 when a server would not start, a refusal, a RED, ...) is debugged from
its artifact on a hosted runner, where nothing else survives the job. So whenever the step does
not pass, the entrypoint writes ``{cell-id}.plan.txt`` into ``out-dir`` (the plan as
``run-live --dry-run`` prints it, or the inputs as given when the step ended before a plan) and
hands that file and the server logs of this step (``server-*.log`` in ``out-dir``, written
since the step began) to the upload step as the output ``debug-paths``, one per line, with
``cell-id`` for the artifact's name. Best effort: a folder that cannot be written leaves no
files, and the annotation still carries the error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.action.inputs import INPUT_DEFAULTS, ActionInputs, input_value
from batch_invariance.action.outputs import relative_to_workspace
from batch_invariance.errors import BatchInvarianceError
from batch_invariance.host import memory
from batch_invariance.service.dry_run import dry_run, usable_cpus
from batch_invariance.service.live import LiveCell
from batch_invariance.service.reach import cannot_be_green

__all__ = ["StepTrace", "debug_outputs"]


@dataclass
class StepTrace:
    """How far the step got: when it began, and the prepared job once there is one."""

    started: float
    job: LiveCell | None = None


def cell_id(inputs: ActionInputs, job: LiveCell | None) -> str:
    """The cert's file stem (the artifact's name), also for a step that wrote no cert."""
    if job is not None:
        return f"{job.model_name}__ctx{job.ctx}__N{job.parallel}"
    model = Path(inputs.model).stem if inputs.model else (inputs.model_alias or "embedded")
    return f"{model}__ctx{inputs.ctx}__N{inputs.parallel}"


def _plan_text(inputs: ActionInputs, job: LiveCell | None, env: Mapping[str, str]) -> str:
    if inputs.mode == "mock":
        return "mock cell: the in-process mock server (no server logs)\n"
    if job is not None:
        with contextlib.suppress(BatchInvarianceError, OSError):
            text = dry_run(job, memory.read_host_memory(), usable_cpus()).text
            causes = cannot_be_green(job)
            return text + "".join(f"this plan cannot reach GREEN: {c}\n" for c in causes)
    given = [
        f"{name}: {value}"
        for name in INPUT_DEFAULTS
        if (value := input_value(env, name)) is not None and value.strip()
    ]
    return "no plan: the step ended before its cell was prepared\ninputs as given:\n" + (
        "\n".join(given) + "\n"
    )


def debug_outputs(
    inputs: ActionInputs, trace: StepTrace, env: Mapping[str, str], stem: str | None = None
) -> dict[str, str]:
    """Write the plan, find this step's server logs; the outputs that hand them on (``stem``:
    the cert's file stem where there is a cert)."""
    stem = stem or cell_id(inputs, trace.job)
    out_dir = inputs.out_dir
    files: list[Path] = []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        plan = out_dir / f"{stem}.plan.txt"
        plan.write_text(_plan_text(inputs, trace.job, env), encoding="utf-8")
        files.append(plan)
        logs = sorted(out_dir.glob("server-*.log"))
        # Only this step's: an out-dir shared by steps of one job keeps earlier logs.
        files += [log for log in logs if log.stat().st_mtime >= trace.started - 1.0]
    except OSError:
        pass
    paths = "\n".join(relative_to_workspace(f, inputs.workspace) for f in files)
    return {"cell-id": stem, "debug-paths": paths}
