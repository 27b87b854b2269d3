"""A fixed corpus of cells whose re-derived judgement pins the decision rules.

A cert verifies under any release with its ``rules_version`` (core/rules.py), because that
release re-derives it field by field to the same values. So every value the re-derivation
rebuilds from the evidence (status, verdict, class, anomaly, reasons, gates, sensitivity,
numerics, scope, ...), the promotability rule and the structure and identity checks must
stay exactly what they were while ``RULES_VERSION`` stays. :func:`verdict_table` judges the
corpus below (every verdict row and gate of the factories' evidence, the policy rule, the
source rule, structure and identity breaks, and the real certs of ``examples/certs``) and
``tests/golden/rules/verdicts.json`` records it with the rules it was judged under;
:func:`rules_problem` says when the two disagree (``tests/unit/core/test_rules.py``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from batch_invariance.cert.advice import engine_advice
from batch_invariance.cert.build import rederive
from batch_invariance.cert.identity import identity_problems
from batch_invariance.cert.schema import Cert, canonical_json, cert_to_json
from batch_invariance.cert.structure import structure_problems
from batch_invariance.cert.verify import promotability
from batch_invariance.core.evidence import CellEvidence, GatePolicy
from batch_invariance.engines.registry import recorded_launch
from tests.support.factories import (
    cert_for,
    changed,
    concurrent_pass,
    green_evidence,
    ids,
    live_provenance,
    load_cert,
    replace_pass,
    replace_trial,
    server_argv,
    spec,
    transport_failure,
)
from tests.support.golden import REGEN_ENV
from tests.support.paths import EXAMPLES, GOLDEN

RECORD = GOLDEN / "rules" / "verdicts.json"
RECORD_NAME = "tests/golden/rules/verdicts.json"
REGEN = f"regenerate with {REGEN_ENV}=1"
#: What a cert is judged from or labelled with, not what the rules derive.
_INPUTS = frozenset(
    {"digest", "tool_version", "rules_version", "cert_version", "evidence", "provenance"}
)


def _c(ev: CellEvidence, test_id: str, index: int = 0, **changes: Any) -> CellEvidence:
    trial = next(p for p in ev.c_passes if p.index == index).trials[test_id]
    return replace_trial(ev, "C", test_id, changed(trial, **changes), index)


def _b(ev: CellEvidence, test_id: str, **changes: Any) -> CellEvidence:
    return replace_trial(ev, "B", test_id, changed(ev.b[test_id], **changes))


def _every_arm(ev: CellEvidence, **changes: Any) -> CellEvidence:
    def each(trials: Mapping[str, Any]) -> dict[str, Any]:
        return {k: changed(t, **changes) for k, t in trials.items()}

    return replace(
        ev,
        a=each(ev.a),
        a_repeat=None if ev.a_repeat is None else each(ev.a_repeat),
        b=each(ev.b),
        c_passes=tuple(replace(p, trials=each(p.trials)) for p in ev.c_passes),
    )


def _cache_pass(ev: CellEvidence, **changes: Any) -> CellEvidence:
    base = concurrent_pass(ids(32), 0)
    trials = {t: replace(x, timings={"cache_n": 40.0}) for t, x in base.trials.items()}
    if changes:
        trials["t004"] = changed(trials["t004"], **changes)
    return replace(ev, cache_passes=(replace(base, trials=trials),))


def _cached(ev: CellEvidence) -> Cert:
    """A cert with a prompt-cache arm, its server recorded as run-live records it."""
    cell = spec()
    servers = [*live_provenance(cell)["servers"]]
    servers.append({"role": "cache", "argv": server_argv(f"/models/{cell.model}.gguf", 2048, 4)})
    return cert_for(ev, extra_provenance={"servers": servers})[0]


def _factory_cases() -> dict[str, Callable[[], Cert]]:
    g = green_evidence
    rep = replace_trial
    lps = tuple(-0.0130917 * (i % 7) - 0.00713 for i in range(11))
    drifted = (lps[0] + 2**-20, *lps[1:])
    return {
        "green": lambda: cert_for()[0],
        "green_mock": lambda: cert_for(source="mock")[0],
        "green_slot_recorded": lambda: cert_for(g(slot_ctx=2048))[0],
        "green_no_serial_repeat": lambda: cert_for(g(serial_repeat=False))[0],
        "green_stricter_policy": lambda: cert_for(policy=GatePolicy(min_hot_trials=40))[0],
        "green_looser_policy": lambda: cert_for(policy=GatePolicy(min_hot_trials=1))[0],
        "green_cache_arm": lambda: _cached(_cache_pass(g())),
        "red_co_batching": lambda: cert_for(_c(g(), "t005", 1, extracted_answer="x"))[0],
        "red_slot_allocation": lambda: cert_for(_b(_c(g(), "t005", score=0.0), "t006", score=0.0))[
            0
        ],
        "red_missing_in_c": lambda: cert_for(rep(g(), "C", "t003", None, 1))[0],
        "red_run_to_run": lambda: cert_for(
            _c(rep(g(), "A_repeat", "t002", changed(g().a["t002"], score=0.0)), "t004", score=0.0)
        )[0],
        "red_prompt_cache": lambda: _cached(_cache_pass(g(), extracted_answer="cached")),
        "amber_token_only": lambda: cert_for(
            _c(g(), "t001", completion="answer-t001 ", extracted_answer="answer-t001")
        )[0],
        "amber_latent_drift": lambda: cert_for(_c(g(), "t001", token_logprobs=drifted))[0],
        "amber_ab": lambda: cert_for(_b(g(), "t006", score=0.0))[0],
        "unverified_f1_overlap": lambda: cert_for(replace_pass(g(), 0, server_busy_max=1))[0],
        "unverified_f3_coverage": lambda: cert_for(_c(g(), "t000", dispatch_ts=None))[0],
        "unverified_transport": lambda: cert_for(
            rep(g(), "C", "t007", transport_failure("t007", "timeout", (100.0, 101.0)))
        )[0],
        "unverified_sample_size": lambda: cert_for(g(n_ids=10))[0],
        "unverified_serial_repeat": lambda: cert_for(
            rep(g(), "A_repeat", "t002", changed(g().a["t002"], completion="other"))
        )[0],
        "unverified_prompt_cache_reuse": lambda: cert_for(
            _c(g(), "t003", 1, timings={"cache_n": 17.0, "prompt_n": 3.0})
        )[0],
        "unverified_answer_length": lambda: cert_for(_every_arm(g(), completion_tokens=3))[0],
        "unverified_no_logprobs": lambda: cert_for(
            _every_arm(g(), token_logprobs=None, top_margins=None)
        )[0],
        "unverified_sequence_scope": lambda: cert_for(replace(g(), slot_ctx=2048))[0],
        "structure_b_stray_id": lambda: _with_stray_b(),
        "identity_mock_relabelled_live": lambda: replace(cert_for(source="mock")[0], source="live"),
    }


def _with_stray_b() -> Cert:
    cert = cert_for()[0]
    b = dict(cert.evidence.b)
    b["stray"] = b["t000"]
    return replace(cert, evidence=replace(cert.evidence, b=b))


def _example_cases() -> dict[str, Callable[[], Cert]]:
    """The real certs of examples/certs: real evidence, re-derived by these rules."""
    folder = EXAMPLES / "certs"
    return {
        "example:" + p.relative_to(folder).as_posix(): partial(load_cert, p)
        for p in sorted(folder.rglob("*.json"))
    }


def _sha(data: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(data).encode("utf-8")).hexdigest()


def judged(cert: Cert) -> dict[str, Any]:
    """What the rules say of one cert: the re-derived verdict in words, whether it could be
    promoted, the structure and identity problems, and a hash of every re-derived field."""
    row: dict[str, Any] = {
        "structure": list(structure_problems(cert)),
        "identity": list(identity_problems(cert, recorded_launch)),
    }
    try:
        rebuilt = rederive(cert, engine_advice)
    except Exception as exc:  # evidence the rules cannot judge is a judgement too
        return {**row, "rederive_error": type(exc).__name__}
    rule = promotability(rebuilt)
    derived = {k: v for k, v in cert_to_json(rebuilt).items() if k not in _INPUTS}
    return {
        **row,
        "status": rebuilt.status,
        "verdict": rebuilt.verdict,
        "divergence_class": rebuilt.divergence_class,
        "anomaly": rebuilt.anomaly,
        "decision_reasons": list(rebuilt.decision_reasons),
        "unmet_gates": sorted(k for k, gate in rebuilt.gates.items() if not gate.ok),
        "promotable": rule.promotable,
        "promotable_reasons": list(rule.reasons),
        "derived_sha256": _sha(derived),
    }


def verdict_table() -> dict[str, dict[str, Any]]:
    """The corpus, judged by the rules of this code."""
    cases = {**_factory_cases(), **_example_cases()}
    return {name: judged(make()) for name, make in sorted(cases.items())}


def table_digest(table: Any) -> str:
    return _sha(table)


def load_record() -> dict[str, Any] | None:
    if not RECORD.is_file():
        return None
    data: dict[str, Any] = json.loads(RECORD.read_text(encoding="utf-8"))
    return data


def write_record(table: Mapping[str, Any], rules_version: int) -> None:
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    record = {"rules_version": rules_version, "digest": table_digest(table), "table": table}
    RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _changed_cases(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    names = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def rules_problem(
    recorded: Mapping[str, Any] | None, table: Mapping[str, Any], rules_version: int
) -> str | None:
    """One line when the recorded judgement and this code's disagree, else ``None``."""
    if recorded is None:
        return f"{RECORD_NAME} is missing: {REGEN}"
    if recorded.get("digest") != table_digest(recorded.get("table")):
        return f"{RECORD_NAME} was edited by hand (its digest is not its table's): {REGEN}"
    was = recorded.get("rules_version")
    if not isinstance(was, int) or rules_version < was:
        return f"RULES_VERSION went from {was} to {rules_version}: it only ever goes up"
    if rules_version > was:
        return (
            f"RULES_VERSION is {rules_version}, {RECORD_NAME} records rules {was}: {REGEN} "
            "(and say what changed in CHANGELOG.md)"
        )
    if recorded["digest"] == table_digest(table):
        return None
    return (
        f"decision rules changed: bump RULES_VERSION in core/rules.py and {REGEN} "
        f"(changed: {_changed_cases(recorded['table'], table)})"
    )


def may_regenerate(
    recorded: Mapping[str, Any] | None, table: Mapping[str, Any], rules_version: int
) -> bool:
    """Regeneration records a new judgement only under new rules (or the same judgement
    again); a changed judgement under the recorded rules must bump them first."""
    if recorded is None:
        return True
    was = recorded.get("rules_version")
    if isinstance(was, int) and rules_version > was:
        return True
    return rules_version == was and recorded.get("table") == table
