"""The throughput block: serial (arm A) against concurrent (C passes) tokens/s, from the arm
records the driver writes, re-derived by verify-cert; and what N buys, in words."""

from __future__ import annotations

import json
from dataclasses import replace

from batch_invariance.cert.build import build_cert
from batch_invariance.cert.schema import (
    canonical_json,
    cert_from_json,
    cert_to_json,
    compute_digest,
)
from batch_invariance.cert.verify import verify
from batch_invariance.core.throughput import (
    NOT_MEASURED,
    n_buys_words,
    throughput_of_arms,
    verdict_words,
)
from batch_invariance.core.verdict import decide
from tests.support.factories import DEFAULT_POLICY, TS, green_evidence, live_provenance, spec


def _arm(arm: str, wall_s: float, tokens: int, n: int = 10, ms: float = 0.0) -> dict[str, object]:
    return {"arm": arm, "wall_s": wall_s, "n_requests": n, "server_predicted_n": tokens,
            "server_predicted_ms": ms}  # fmt: skip


def test_speedup_is_concurrent_over_serial_tokens_per_second() -> None:
    block = throughput_of_arms(
        [_arm("A", 10.0, 500, ms=8000.0), _arm("B", 10.0, 500),
         _arm("C", 2.0, 500), _arm("C", 3.0, 500)]
    )  # fmt: skip
    assert block is not None
    assert block.serial_tokens_per_s == 50.0  # B is not the serial reference
    assert block.concurrent_tokens_per_s == 200.0  # 1000 tokens over 5 s of passes
    assert block.speedup == 4.0
    assert block.serial_requests_per_s == 1.0 and block.concurrent_requests_per_s == 4.0
    assert block.serial_decode_tokens_per_s == 62.5
    assert (block.serial_tokens, block.concurrent_tokens) == (500, 1000)


def test_no_tokens_reported_means_not_measured() -> None:
    block = throughput_of_arms([_arm("A", 10.0, 0), _arm("C", 2.0, 0)])
    assert block is not None and block.speedup is None and block.serial_tokens_per_s is None
    assert throughput_of_arms(None) is None and throughput_of_arms("arms") is None
    odd = throughput_of_arms([{"arm": "A", "wall_s": "x", "server_predicted_n": True}, 3])
    assert odd is not None and odd.speedup is None


def _cert_text() -> str:
    ev = green_evidence()
    cell = spec()
    prov = {**live_provenance(cell)}
    cert = build_cert(ev, decide(ev, DEFAULT_POLICY), cell, DEFAULT_POLICY, prov, "live", TS)
    assert cert.throughput is not None and cert.throughput.speedup is not None
    return json.dumps(cert_to_json(cert))


def test_verify_cert_recomputes_the_block_from_the_arm_records() -> None:
    text = _cert_text()
    assert verify(text).problems == ()
    data = json.loads(text)
    data["throughput"]["speedup"] = 99.0
    forged = cert_from_json(canonical_json(data))
    redigested = replace(forged, digest=compute_digest(cert_to_json(forged)))
    problems = verify(json.dumps(cert_to_json(redigested))).problems
    assert problems and any("throughput" in p for p in problems)


def test_a_cert_without_the_block_stays_valid_and_has_no_key() -> None:
    ev = green_evidence()
    cell = spec()
    cert = build_cert(ev, decide(ev, DEFAULT_POLICY), cell, DEFAULT_POLICY,
                      live_provenance(cell), "live", TS, with_throughput=False)  # fmt: skip
    data = cert_to_json(cert)
    assert "throughput" not in data
    assert verify(json.dumps(data)).problems == ()


def test_the_words_say_what_n_buys_and_that_a_green_no_faster_than_serial_buys_nothing() -> None:
    slower = n_buys_words("GREEN", 4, 0.9)
    assert slower == (
        "N=4 buys 0.90x here: concurrent is not faster than serial, so N=4 buys nothing here"
    )
    assert n_buys_words("GREEN", 4, 1.0).endswith("N=4 buys nothing here")  # 1.0 buys nothing
    assert verdict_words("GREEN", 4, 1.72) == "GREEN: N=4 buys 1.72x here"
    assert verdict_words("GREEN", 4, 0.9) == f"GREEN: {slower}"


def test_a_red_n_would_buy_what_staying_serial_costs() -> None:
    assert n_buys_words("RED", 4, 2.5) == "N=4 would buy 2.50x here; staying serial costs this"
    assert n_buys_words("RED", 8, 0.35) == (
        "N=8 would buy 0.35x here: concurrent is not faster than serial, so staying serial "
        "costs nothing"
    )
    assert n_buys_words("UNVERIFIED", 2, 1.5) == "N=2 would buy 1.50x here if shown safe"
    assert n_buys_words("AMBER", 2, 0.8).endswith("so it would buy nothing")


def test_missing_throughput_is_not_measured_whatever_the_verdict() -> None:
    for verdict in ("GREEN", "RED", "AMBER", "UNVERIFIED"):
        assert n_buys_words(verdict, 4, None) == NOT_MEASURED == "throughput not measured"
    assert verdict_words("GREEN", 4, None) == "GREEN: throughput not measured"
