"""`batch-invariance run-mock`: the full A/B/C gate against the in-process mock server.

request (argparse -> :class:`~batch_invariance.service.mock_cell.MockRequest`) -> service
(:func:`~batch_invariance.service.mock_cell.run_mock_cell`) -> render -> exit code. The default
mock is batch-invariant and should earn GREEN; ``--batch-divergence`` makes co-batched
requests change their answers and should earn RED. Exit 0 when the verdict is the one the
mode predicts; the cert says ``source: mock`` and is never promotable.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.commands.cell_options import add_policy_options, policy_from_args
from batch_invariance.report.render import mock_prediction, mock_report
from batch_invariance.run.progress import Progress
from batch_invariance.service.mock_cell import MOCK_MODEL, MockRequest, run_mock_cell

_DEFAULTS = MockRequest(out_dir=Path())


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
    d = _DEFAULTS
    p.add_argument("--out-dir", required=True, type=Path, help="folder for the cert")
    p.add_argument(
        "--batch-divergence",
        action="store_true",
        help="make co-batched requests change their answers (expect RED)",
    )
    p.add_argument("--ctx", type=int, default=d.ctx, help="tokens per slot")
    p.add_argument("--parallel", type=int, default=d.parallel, help="N slots of the B/C server")
    m = d.measurement
    p.add_argument("--gate-passes", type=int, default=m.gate_passes, help="concurrent C passes")
    p.add_argument(
        "--workset",
        type=Path,
        default=None,
        help="work-set JSON (default: the length ladder of the slot)",
    )
    p.add_argument("--scorer", default=None, help="pkg.mod:NAME or file.py:NAME")
    p.add_argument("--reps", type=int, default=m.reps, help="repeat each row R times")
    p.add_argument("--n-predict", type=int, default=m.n_predict, help="token budget per request")
    p.add_argument("--seed", type=int, default=m.seed, help="dispatch-order and request seed")
    add_policy_options(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    request = MockRequest(
        out_dir=args.out_dir,
        batch_divergence=bool(args.batch_divergence),
        ctx=args.ctx,
        parallel=args.parallel,
        measurement=replace(
            _DEFAULTS.measurement,
            gate_passes=args.gate_passes,
            reps=args.reps,
            n_predict=args.n_predict,
            seed=args.seed,
        ),
        policy=policy_from_args(args),
        workset=args.workset,
        scorer=args.scorer,
    )
    finished = run_mock_cell(request, progress=Progress())
    cert = finished.cert
    divergence = request.batch_divergence
    sys.stdout.write(
        mock_report(cert, finished.path, finished.superseded, model=MOCK_MODEL,
                    divergence_mode=divergence)
    )  # fmt: skip
    as_predicted, line = mock_prediction(cert.status, divergence)
    print(line, file=sys.stdout if as_predicted else sys.stderr)
    # The README's exit codes, like every command: RED 1, anything else 3 (never promotable).
    return exitcodes.for_status(cert.status, promotable=False)
