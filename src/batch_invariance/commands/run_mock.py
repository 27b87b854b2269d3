"""`batch-invariance run-mock`: the full A/B/C gate against the in-process mock server.

The same :func:`~batch_invariance.run.cell.run_cell` /
:func:`~batch_invariance.run.cell.finish_cell` path as a live run, with
:class:`~batch_invariance.engines.mock.MockLauncher` in place of real
``llama-server`` processes. The verdict is really computed: the default mock is batch-invariant
and should earn GREEN; ``--batch-divergence`` makes co-batched requests change their answers and
should earn RED. The cert says ``source: mock`` and is never promotable, so the exit code is
the README table's: 1 for RED, 3 for anything else (a mock GREEN included).
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from batch_invariance import __version__, exitcodes
from batch_invariance.cert.certificate import display_verdict
from batch_invariance.commands.run_live import add_policy_options, policy_from_args
from batch_invariance.core.evidence import CellSpec
from batch_invariance.engines.mock import MockKnobs, MockLauncher
from batch_invariance.errors import UsageError
from batch_invariance.run.cell import CellPlan, finish_cell, run_cell
from batch_invariance.run.progress import Progress
from batch_invariance.run.scorer_loader import load_scorer
from batch_invariance.run.workset import Workset, expand_reps, load_workset

#: The cert's model name for mock cells.
MOCK_MODEL = "mock"

#: Defaults sized so the default run earns GREEN (32 distinct prompts, answers of about 80
#: tokens, 4 passes) in a few seconds.
DEFAULT_CTX = 2048
DEFAULT_PARALLEL = 4
DEFAULT_PASSES = 4
DEFAULT_N_PREDICT = 128


def bundled_workset() -> Workset:
    """The bundled mock work-set (a copy of ``examples/workset.json``)."""
    ref = resources.files("batch_invariance").joinpath("data/worksets/mock.json")
    with resources.as_file(ref) as path:
        return load_workset(path)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "run-mock",
        help="run the A/B/C gate against the in-process mock server (a demo; never promotable)",
        description=(
            "Runs the full A/B/C gate against an in-process mock llama-server on loopback and "
            "writes a cert with source=mock. Default: a batch-invariant mock (expect GREEN). "
            "--batch-divergence: co-batched requests change their answers (expect RED). "
            "Exit codes as everywhere: 1 RED, 3 any other verdict (a mock cert is never "
            "promotable, so never 0)."
        ),
    )
    p.add_argument("--out-dir", required=True, type=Path, help="folder for the cert")
    p.add_argument(
        "--batch-divergence",
        action="store_true",
        help="make co-batched requests change their answers (expect RED)",
    )
    p.add_argument("--ctx", type=_positive, default=DEFAULT_CTX, help="tokens per slot")
    p.add_argument(
        "--parallel", type=_positive, default=DEFAULT_PARALLEL, help="N slots of the B/C server"
    )
    p.add_argument(
        "--gate-passes", type=_positive, default=DEFAULT_PASSES, help="concurrent C passes (T)"
    )
    p.add_argument(
        "--workset", type=Path, default=None, help="work-set JSON (default: the bundled one)"
    )
    p.add_argument("--scorer", default=None, help="pkg.mod:NAME or file.py:NAME")
    p.add_argument("--reps", type=_positive, default=1, help="repeat each row R times")
    p.add_argument(
        "--n-predict",
        type=_positive,
        default=DEFAULT_N_PREDICT,
        help=f"token budget per request (default {DEFAULT_N_PREDICT})",
    )
    p.add_argument("--seed", type=int, default=0, help="dispatch-order and request seed")
    add_policy_options(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    if args.parallel < 2:
        raise UsageError("--parallel must be at least 2 for the C arm to co-batch anything")
    policy = policy_from_args(args)
    workset = load_workset(args.workset) if args.workset is not None else bundled_workset()
    scorer = load_scorer(args.scorer)
    out_dir: Path = args.out_dir
    # Checked before the run: a bad --out-dir must not cost a whole cell.
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out-dir {out_dir}: cannot create it ({exc.strerror or exc})") from None
    items = expand_reps(workset.items, args.reps)
    plan = CellPlan(
        items=items,
        ctx=args.ctx,
        parallel=args.parallel,
        gate_passes=args.gate_passes,
        n_predict=args.n_predict,
        seed=args.seed,
        endpoint="chat",
        req_timeout=30.0,
    )
    knobs = MockKnobs(cobatch_divergence=bool(args.batch_divergence), seed=args.seed)
    launcher = MockLauncher(knobs)
    run = run_cell(plan, launcher, scorer, progress=Progress())
    spec = CellSpec(
        model=MOCK_MODEL, ctx=args.ctx, dispatch_n=args.parallel, kv_label=run.kv_label,
        reps=args.reps,
    )  # fmt: skip
    provenance = {
        "tool_version": __version__,
        "driver": "run-mock",
        "mock_knobs": {"cobatch_divergence": knobs.cobatch_divergence, "seed": knobs.seed},
        "workset": {"source": workset.source, "sha256": workset.sha256, "n_rows": len(items)},
        "scorer_id": run.scorer_id,
    }
    finished = finish_cell(run, spec, policy, provenance, out_dir)
    status = finished.cert.status
    shown = display_verdict(status)
    expected = "failed" if args.batch_divergence else "green"
    mode = "--batch-divergence" if args.batch_divergence else "default"
    bar = "=" * 72
    print(bar)
    print(f"  {shown}  mock cell {MOCK_MODEL} ctx={args.ctx} N={args.parallel}  ({mode} mode)")
    print(bar)
    for reason in finished.cert.decision_reasons:
        print(f"  - {reason}")
    print(f"cert: {finished.path}")
    if finished.superseded is not None:
        print(f"previous cert moved to: {finished.superseded}")
    print("source=mock: never promotable (verify-cert never exits 0 on it, by design)")
    if status == expected:
        print(f"mock behaved as the {mode} mode predicts ({display_verdict(expected)})")
    else:
        print(
            f"batch-invariance: the mock did NOT behave as the {mode} mode predicts: expected "
            f"{display_verdict(expected)}, got {shown}",
            file=sys.stderr,
        )
    return exitcodes.for_status(status, promotable=False)
