"""Cert-shaped dicts and real mock certs for the report tests.

The dicts carry only the documented fields the report reads (the report model is fed JSON,
not the pydantic model), so the golden outputs do not move when the cert gains fields.
:func:`mock_cert` runs the real ``run-mock`` command (once per session for each kind) for tests
that need a cert that verifies.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

from batch_invariance.cli import main
from batch_invariance.report.model import LoadedCert, Signature

UNSIGNED = Signature("unsigned", "no bundle")


def _gates(f0_ok: bool, unmet: tuple[str, ...] = ()) -> dict[str, Any]:
    names = ("F0", "F1", "F2", "F3", "F4", "F5", "min_hot_trials", "serial_repeat", "transport")
    gates = {name: {"ok": name not in unmet, "reason": f"{name} met"} for name in names}
    gates["F0"] = {"ok": f0_ok, "reason": "F0 exact match " + ("met" if f0_ok else "failed")}
    for name in unmet:
        gates[name] = {"ok": False, "reason": f"{name} not met: because"}
    return gates


def green_data(
    n: int,
    *,
    model: str = "tiny",
    ctx: int = 2048,
    bound: float = 0.0469,
    throughput: dict[str, Any] | None = None,
    answer_tokens: tuple[int, int, int] | None = None,
    distinct: int | None = None,
) -> dict[str, Any]:
    scope: dict[str, Any] = {"valid_for": f"only model {model} at ctx {ctx} with --parallel {n}"}
    if answer_tokens is not None:
        lo, mid, hi = answer_tokens
        scope |= {
            "answer_tokens_min": lo,
            "answer_tokens_median": mid,
            "answer_tokens_max": hi,
            "share_cut_by_budget": 0.25,
        }
    sensitivity: dict[str, Any] = {
        "n_hot_trials": 64,
        "n_scored_comparisons": 64,
        "n_ac_divergent": 0,
        "rate_upper_bound_95": bound,
        "observed_rate": None,
        "ci95_low": None,
        "ci95_high": None,
    }
    if distinct is not None:
        sensitivity["n_distinct_prompts"] = distinct
    data: dict[str, Any] = {
        "model": model,
        "ctx": ctx,
        "dispatch_n": n,
        "status": "green",
        "verdict": "GREEN",
        "source": "live",
        "n_passes": 4,
        "decision_reasons": ["every gate met"],
        "gates": _gates(True),
        "sensitivity": sensitivity,
        "promotion_scope": scope,
        "divergence_report": {"AC": {"per_id": []}},
        "evidence": {"a": {}, "c_passes": []},
    }
    if throughput is not None:
        data["throughput"] = throughput
    return data


def red_data(n: int, *, model: str = "tiny", ctx: int = 2048) -> dict[str, Any]:
    """A RED cell: ``q1`` flips at token 2 on passes 0 and 2 (a near tie), ``q2`` on pass 1
    with no tokens recorded, ``q3`` changed content only on pass 3."""
    a_tokens = ["The", " answer", " is", " 42", "."]
    c_tokens = ["The", " answer", " was", " 42", "."]
    a = {
        "q1": {"tokens": a_tokens, "top_margins": [3.0, 2.5, 0.02, 1.0, 1.0]},
        "q2": {"completion_excerpt": "Paris"},
        "q3": {"tokens": ["x"], "completion_excerpt": "x"},
    }
    c_passes = [
        {"index": k, "trials": {"q1": {"tokens": c_tokens}, "q2": {"completion_excerpt": "Rome"}}}
        for k in range(4)
    ]

    def row(test_id: str, pass_index: int, kind: str, token: int | None) -> dict[str, Any]:
        return {
            "test_id": test_id,
            "pass_index": pass_index,
            "kind": kind,
            "field": "content" if kind == "token_only" else "extracted_answer",
            "first_divergent_token": token,
            "x_top_margin": 0.02 if test_id == "q1" else None,
            "y_top_margin": None,
            "x_excerpt": "Paris" if test_id == "q2" else None,
            "y_excerpt": "Rome" if test_id == "q2" else None,
        }

    per_id = [
        row("q1", 0, "invariant", 2),
        row("q1", 2, "invariant", 2),
        row("q1", 3, "token_only", 2),
        row("q2", 1, "invariant", None),
        row("q3", 3, "token_only", 0),
    ]
    return {
        "model": model,
        "ctx": ctx,
        "dispatch_n": n,
        "status": "failed",
        "verdict": "RED",
        "source": "live",
        "n_passes": 4,
        "decision_reasons": ["AC: 2 of 16 ids diverged", "AB clean"],
        "gates": _gates(False, ("F5",)),
        "sensitivity": {
            "n_hot_trials": 64,
            "n_scored_comparisons": 64,
            "n_ac_divergent": 3,
            "rate_upper_bound_95": None,
            "observed_rate": 0.046875,
            "ci95_low": 0.0098,
            "ci95_high": 0.1309,
        },
        "promotion_scope": {"valid_for": f"only model {model} at ctx {ctx} with --parallel {n}"},
        "divergence_report": {"AC": {"per_id": per_id}},
        "evidence": {"a": a, "c_passes": c_passes},
        "numerics": red_numerics(),
    }


def red_numerics() -> dict[str, Any]:
    """The numerics of :func:`red_data`: ``q1`` flips on passes 0 and 2, ``q3`` drifts on
    pass 1 with equal tokens, ``q2`` carries no logprobs."""

    def row(test_id: str, index: int, first: int | None, flip: int | None) -> dict[str, Any]:
        return {"test_id": test_id, "pass_index": index, "positions": 2,
                "first_drift": first, "max_abs_delta": 0.1875, "token_flip": flip}  # fmt: skip

    def per_pass(index: int, drift: int, flips: int) -> dict[str, Any]:
        delta = 0.1875 if drift else 0.0
        return {"pass_index": index, "rows_compared": 2, "rows_with_drift": drift,
                "rows_with_token_flip": flips, "max_abs_delta": delta}  # fmt: skip

    return {
        "statement": "batching changed the numerics on 2 of 2 rows (max |delta| 0.188)",
        "AC": {
            "per_pass": [
                per_pass(0, 1, 1),
                per_pass(1, 1, 0),
                per_pass(2, 1, 1),
                per_pass(3, 0, 0),
            ],
            "rows": [row("q1", 0, 1, 2), row("q1", 2, 1, 2), row("q3", 1, 0, None)],
            "ids_without_logprobs": ["q2"],
        },
        "risk": {
            "per_token_flip_probability": 0.0125,
            "curve": [
                {"tokens": k, "answer_change_share": 1 - (1 - 0.0125) ** k}
                for k in (64, 128, 256, 512, 1024)
            ],
        },
    }


def loaded(data: dict[str, Any], origin: str, promotable: bool = False) -> LoadedCert:
    return LoadedCert(origin, data, None, promotable, UNSIGNED)


def sweep_inputs() -> list[LoadedCert]:
    """The golden input: a three-N sweep with throughput, a second model, one invalid."""
    tp = {"serial_tokens_per_s": 40.0, "speedup": None}
    return [
        loaded(
            green_data(
                2,
                answer_tokens=(12, 40, 96),
                throughput=tp | {"concurrent_tokens_per_s": 70.0, "speedup": 1.75},
            ),
            "sweep/tiny__ctx2048__N2.json",
            promotable=True,
        ),
        loaded(red_data(8), "sweep/tiny__ctx2048__N8.json"),
        loaded(
            green_data(4, throughput=tp | {"concurrent_tokens_per_s": 120.0, "speedup": 3.0}),
            "sweep/tiny__ctx2048__N4.json",
            promotable=True,
        ),
        loaded(green_data(4, model="other", ctx=1024, distinct=16), "other__ctx1024__N4.json"),
        LoadedCert(
            "broken__ctx2048__N4.json",
            None,
            "broken__ctx2048__N4.json: digest mismatch: the cert was changed after it was written",
            False,
            Signature("unsigned", "not checked"),
        ),
    ]


#: The certs of the real mock cells run so far, by (N, red): one run-mock per kind for the
#: session (each takes seconds), not one per module that needs a cert that verifies.
_RUN_MOCK: dict[tuple[int, bool], Path] = {}


def mock_cert(folder: Path, parallel: int, *, red: bool = False) -> Path:
    """The cert a real mock cell (run-mock at N ``parallel``) wrote, copied into ``folder``:
    the cell runs once per session for each (N, red); each caller gets its own file."""
    name = f"mock__ctx512__N{parallel}.json"
    if (parallel, red) not in _RUN_MOCK:
        out = Path(tempfile.mkdtemp(prefix="bi-run-mock-"))
        atexit.register(shutil.rmtree, out, ignore_errors=True)
        argv = ["run-mock", "--out-dir", str(out), "--parallel", str(parallel)]
        if red:
            argv.append("--batch-divergence")
        # run-mock exits as the README table says: 1 for a RED, 3 for a (never promotable) GREEN.
        assert main(argv) == (1 if red else 3)
        _RUN_MOCK[(parallel, red)] = out / name
    target = folder / name
    shutil.copyfile(_RUN_MOCK[(parallel, red)], target)
    return target
