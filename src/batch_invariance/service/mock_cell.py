"""The mock-cell service: the full A/B/C gate against the in-process mock server.

The same :func:`~batch_invariance.run.cell.run_cell` and
:func:`~batch_invariance.service.finish.finish_cell`
path as a live cell, with the mock launcher in place of real ``llama-server`` processes. The
verdict is really computed; the cert says ``source: mock`` and is never promotable.
``run-mock`` and the Action's mock mode call :func:`run_mock_cell`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from batch_invariance import __version__
from batch_invariance.cert.provenance import Provenance
from batch_invariance.core.evidence import CellSpec, GatePolicy, policy_usage_problems
from batch_invariance.core.plan import (
    CTX,
    PARALLEL,
    CellPlan,
    Measurement,
    number_field,
    number_problems,
)
from batch_invariance.errors import UsageError
from batch_invariance.mock import MockKnobs, MockLauncher
from batch_invariance.mock.oracle import tokenize
from batch_invariance.profiles.ladder import ladder_builder
from batch_invariance.run.cell import run_cell
from batch_invariance.run.progress import ProgressSink
from batch_invariance.run.scorer_loader import load_scorer
from batch_invariance.run.workset import Workset, expand_reps, load_workset
from batch_invariance.service.finish import FinishedCell, finish_cell, prepare_out_dir

__all__ = ["MOCK_MEASUREMENT", "MOCK_MODEL", "MockRequest", "run_mock_cell"]

#: The cert's model name for mock cells.
MOCK_MODEL = "mock"


#: How a mock cell is measured. The notes need a budget of 128: the mock's notes run about
#: 66-89 tokens and the length floor needs 64. Requests to the in-process mock time out at 30 s.
MOCK_MEASUREMENT = Measurement(gate_passes=4, reps=1, n_predict=128, req_timeout=30.0)


@dataclass(frozen=True)
class MockRequest:
    """A mock cell. Defaults are sized so the default run earns GREEN (the length ladder of
    a 512-token slot: 32 distinct documents, notes of about 80 tokens, 4 passes) in seconds."""

    out_dir: Path
    batch_divergence: bool = False
    ctx: int = number_field(CTX, 512)
    parallel: int = number_field(PARALLEL, 4)
    measurement: Measurement = MOCK_MEASUREMENT
    workset: Path | None = None
    scorer: str | None = None
    policy: GatePolicy = field(default_factory=GatePolicy)


def mock_token_count(text: str) -> int:
    """The mock's own token count of a text (what its ``/tokenize`` answers)."""
    return len(tokenize(text))


def mock_ladder(request: MockRequest) -> Workset:
    """The length ladder for the mock's slot, fitted with the mock's own tokenizer: the
    mock, like every default, measures the whole slot."""
    m = request.measurement
    build = ladder_builder(m.n_predict, m.seed, "the mock's tokenizer")
    return build(request.ctx, mock_token_count)


def run_mock_cell(request: MockRequest, progress: ProgressSink | None = None) -> FinishedCell:
    """Check the request, run the mock cell and write its cert."""
    problems = number_problems(request) + policy_usage_problems(request.policy)
    if problems:
        raise UsageError(problems[0])
    workset = load_workset(request.workset) if request.workset is not None else mock_ladder(request)
    scorer = load_scorer(request.scorer)
    out_dir = prepare_out_dir(request.out_dir)
    m = request.measurement
    items = expand_reps(workset.items, m.reps)
    plan = CellPlan(items=items, ctx=request.ctx, parallel=request.parallel, measurement=m)
    # Prompts are evaluated in batches, several times faster per token than decoding, as on
    # a real server: the ladder's long prompts then cost seconds, not a minute.
    knobs = MockKnobs(
        cobatch_divergence=request.batch_divergence, seed=m.seed, prompt_token_delay_s=1e-4
    )
    run = run_cell(plan, MockLauncher(knobs), scorer, progress=progress, policy=request.policy)
    spec = CellSpec(
        model=MOCK_MODEL, ctx=request.ctx, dispatch_n=request.parallel, kv_label=run.kv_label,
        reps=m.reps,
    )  # fmt: skip
    provenance = Provenance(
        tool_version=__version__,
        driver="run-mock",
        mock_knobs={"cobatch_divergence": knobs.cobatch_divergence, "seed": knobs.seed},
        workset={**workset.record(), "n_rows": len(items)},
    )
    return finish_cell(run, spec, request.policy, provenance, out_dir)
