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
from batch_invariance.core.plan import CellPlan, number_problems
from batch_invariance.errors import UsageError
from batch_invariance.mock import MockKnobs, MockLauncher
from batch_invariance.mock.oracle import tokenize
from batch_invariance.profiles.ladder import ladder_builder
from batch_invariance.run.cell import run_cell
from batch_invariance.run.progress import ProgressSink
from batch_invariance.run.scorer_loader import load_scorer
from batch_invariance.run.workset import Workset, expand_reps, load_workset
from batch_invariance.service.finish import FinishedCell, finish_cell, prepare_out_dir

__all__ = ["MOCK_MODEL", "MockRequest", "run_mock_cell"]

#: The cert's model name for mock cells.
MOCK_MODEL = "mock"


@dataclass(frozen=True)
class MockRequest:
    """A mock cell. Defaults are sized so the default run earns GREEN (the length ladder of
    a 512-token slot: 32 distinct documents, notes of about 80 tokens, 4 passes) in seconds."""

    out_dir: Path
    batch_divergence: bool = False
    stop_on_red: bool = False
    ctx: int = 512
    parallel: int = 4
    gate_passes: int = 4
    reps: int = 1
    #: Long enough for the mock's notes (about 66-89 tokens): the length floor needs 64.
    n_predict: int = 128
    seed: int = 0
    workset: Path | None = None
    scorer: str | None = None
    policy: GatePolicy = field(default_factory=GatePolicy)


def mock_token_count(text: str) -> int:
    """The mock's own token count of a text (what its ``/tokenize`` answers)."""
    return len(tokenize(text))


def mock_ladder(request: MockRequest) -> Workset:
    """The length ladder for the mock's slot, fitted with the mock's own tokenizer: the
    mock, like every default, measures the whole slot."""
    build = ladder_builder(request.n_predict, request.seed, "the mock's tokenizer")
    return build(request.ctx, mock_token_count)


def run_mock_cell(request: MockRequest, progress: ProgressSink | None = None) -> FinishedCell:
    """Check the request, run the mock cell and write its cert."""
    problems = number_problems(
        {
            "ctx": request.ctx,
            "parallel": request.parallel,
            "gate_passes": request.gate_passes,
            "reps": request.reps,
            "n_predict": request.n_predict,
        }
    )
    problems += policy_usage_problems(request.policy)
    if problems:
        raise UsageError(problems[0])
    workset = load_workset(request.workset) if request.workset is not None else mock_ladder(request)
    scorer = load_scorer(request.scorer)
    out_dir = prepare_out_dir(request.out_dir)
    items = expand_reps(workset.items, request.reps)
    plan = CellPlan(
        items=items,
        ctx=request.ctx,
        parallel=request.parallel,
        gate_passes=request.gate_passes,
        n_predict=request.n_predict,
        seed=request.seed,
        endpoint="chat",
        req_timeout=30.0,
        stop_on_red=request.stop_on_red,
    )
    # Prompts are evaluated in batches, several times faster per token than decoding, as on
    # a real server: the ladder's long prompts then cost seconds, not a minute.
    knobs = MockKnobs(
        cobatch_divergence=request.batch_divergence, seed=request.seed, prompt_token_delay_s=1e-4
    )
    run = run_cell(plan, MockLauncher(knobs), scorer, progress=progress, policy=request.policy)
    spec = CellSpec(
        model=MOCK_MODEL, ctx=request.ctx, dispatch_n=request.parallel, kv_label=run.kv_label,
        reps=request.reps,
    )  # fmt: skip
    provenance = Provenance(
        tool_version=__version__,
        driver="run-mock",
        mock_knobs={"cobatch_divergence": knobs.cobatch_divergence, "seed": knobs.seed},
        workset={**workset.record(), "n_rows": len(items)},
    )
    return finish_cell(run, spec, request.policy, provenance, out_dir)
