"""The in-process mock llama-server: its surface, its real concurrency and its knobs."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
import requests

from batch_invariance.errors import InfraError
from batch_invariance.mock import (
    MockKnobs,
    MockLauncher,
    MockServer,
    answer_for,
    diverged_answer,
    tokenize,
)


def _chat(base: str, content: str, **extra: object) -> requests.Response:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 16, **extra}
    return requests.post(base + "/v1/chat/completions", json=body, timeout=10)


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [
        ("What is 6 * 7?", "42"),
        ("what is 10 - 12? number only", "-2"),
        ("What is the capital of Peru?", "Lima"),
        ("blah. The secret code is AB-12. What is the secret code?", "AB-12"),
        ("Reverse the word stop", "pots"),
        ("Spell mock in uppercase", "MOCK"),
        ("How many letters in banana?", "6"),
    ],
)
def test_answers_known_questions(prompt: str, answer: str) -> None:
    assert answer_for(prompt) == answer


def test_unknown_prompts_get_deterministic_filler_and_divergence_changes_answers() -> None:
    assert answer_for("tell me a story") == answer_for("tell me a story")
    assert answer_for("tell me a story") != answer_for("tell me another story")
    for answer in ("42", "Paris", "QX-7731", "", "x"):
        assert diverged_answer(answer) != answer


def test_tokenizer_is_lossless() -> None:
    text = "  Hello, world!  It's 42.\n"
    assert "".join(tokenize(text)) == text


def test_surface_health_props_slots_metrics_tokenize() -> None:
    with MockServer(parallel=3, ctx=512) as server:
        base = server.base_url
        assert base.startswith("http://127.0.0.1:")
        assert requests.get(base + "/health", timeout=5).json() == {"status": "ok"}
        props = requests.get(base + "/props", timeout=5).json()
        assert props["total_slots"] == 3
        slots = requests.get(base + "/slots", timeout=5).json()
        assert [s["id"] for s in slots] == [0, 1, 2]
        assert all(s["is_processing"] is False for s in slots)
        metrics = requests.get(base + "/metrics", timeout=5).text
        assert "llamacpp:requests_processing 0" in metrics
        tok = requests.post(base + "/tokenize", json={"content": "a b"}, timeout=5).json()
        assert len(tok["tokens"]) == 2
        pieces = requests.post(
            base + "/tokenize", json={"content": "a b", "with_pieces": True}, timeout=5
        ).json()
        assert [p["piece"] for p in pieces["tokens"]] == ["a", " b"]
        assert requests.get(base + "/nope", timeout=5).status_code == 404


def test_metrics_and_slots_can_be_disabled() -> None:
    with MockServer(knobs=MockKnobs(metrics=False, slots_endpoint=False)) as server:
        assert requests.get(server.base_url + "/metrics", timeout=5).status_code == 501
        assert requests.get(server.base_url + "/slots", timeout=5).status_code == 501


def test_loading_delay_gives_503_then_ready() -> None:
    with MockServer(knobs=MockKnobs(loading_delay_s=0.3)) as server:
        assert requests.get(server.base_url + "/health", timeout=5).status_code == 503
        assert _chat(server.base_url, "What is 1 + 1?").status_code == 503
        time.sleep(0.35)
        assert requests.get(server.base_url + "/health", timeout=5).status_code == 200
        assert _chat(server.base_url, "What is 1 + 1?").status_code == 200


def test_chat_and_completion_shapes() -> None:
    with MockServer(parallel=2) as server:
        r = _chat(server.base_url, "What is 3 + 4?", logprobs=True, top_logprobs=2).json()
        choice = r["choices"][0]
        assert choice["message"]["content"] == "7"
        assert choice["finish_reason"] == "stop"
        entry = choice["logprobs"]["content"][0]
        assert entry["token"] == "7" and len(entry["top_logprobs"]) == 2
        assert r["usage"]["completion_tokens"] == 1 and r["timings"]["cache_n"] == 0
        assert _chat(server.base_url, "x", top_logprobs=2).status_code == 400
        no_lp = _chat(server.base_url, "What is 3 + 4?").json()["choices"][0]
        assert "logprobs" not in no_lp
        r = requests.post(
            server.base_url + "/v1/completions",
            json={"prompt": "What is 3 + 4?", "logprobs": 1, "max_tokens": 8},
            timeout=5,
        ).json()
        assert r["choices"][0]["text"] == "7" and r["object"] == "text_completion"
        assert len(r["choices"][0]["logprobs"]["content"]) == 1
        native = requests.post(
            server.base_url + "/completion", json={"prompt": "What is 3 + 4?"}, timeout=5
        ).json()
        assert native["content"] == "7" and native["id_slot"] in (0, 1)


def test_max_tokens_truncates_with_length() -> None:
    with MockServer() as server:
        r = requests.post(
            server.base_url + "/v1/completions",
            json={"prompt": "tell me a story", "max_tokens": 2},
            timeout=5,
        ).json()
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 2


def _fire(base: str, n: int, prompt: str = "What is 2 + 2?") -> list[requests.Response]:
    out: list[requests.Response] = []
    lock = threading.Lock()

    def one() -> None:
        r = _chat(base, prompt)
        with lock:
            out.append(r)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_really_runs_n_slots_concurrently_and_queues_the_rest() -> None:
    knobs = MockKnobs(token_delay_s=0.05, prompt_token_delay_s=0.0)
    with MockServer(parallel=2, knobs=knobs) as server:
        started = time.monotonic()
        responses = _fire(server.base_url, 4)
        elapsed = time.monotonic() - started
        assert all(r.status_code == 200 for r in responses)
        assert server.stats.max_busy == 2  # two at once, never more
        assert server.stats.requests == 4
        # Four 50 ms requests on two slots: two rounds, not one and not four.
        assert 0.09 < elapsed < 0.6


def test_http_errors_under_load() -> None:
    knobs = MockKnobs(http_error_min_busy=1, token_delay_s=0.05)
    with MockServer(parallel=4, knobs=knobs) as server:
        assert _chat(server.base_url, "What is 1 + 1?").status_code == 200  # alone: fine
        codes = sorted(r.status_code for r in _fire(server.base_url, 4))
        assert 503 in codes and 200 in codes
        assert server.stats.refused >= 1


def test_empty_and_hang_knobs() -> None:
    knobs = MockKnobs(empty_if_contains=("EMPTY",), hang_if_contains=("HANG",), hang_s=0.5)
    with MockServer(knobs=knobs) as server:
        r = _chat(server.base_url, "EMPTY: What is 1 + 1?").json()
        assert r["choices"][0]["message"]["content"] == ""
        with pytest.raises(requests.Timeout):
            requests.post(
                server.base_url + "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "HANG"}]},
                timeout=0.2,
            )


def test_cobatch_and_token_divergence_knobs() -> None:
    slow = MockKnobs(token_delay_s=0.03, prompt_token_delay_s=0.0)
    with MockServer(parallel=4, knobs=replace(slow, cobatch_divergence=True)) as server:
        alone = _chat(server.base_url, "What is 2 + 2?").json()
        assert alone["choices"][0]["message"]["content"] == "4"
        together = {r.json()["choices"][0]["message"]["content"] for r in _fire(server.base_url, 4)}
        assert "5" in together  # co-batched requests changed their answer
    with MockServer(parallel=4, knobs=replace(slow, token_divergence=True)) as server:
        together = {r.json()["choices"][0]["message"]["content"] for r in _fire(server.base_url, 4)}
        assert {t.strip() for t in together} == {"4"}
        assert "4\n" in together  # same answer, different content and tokens


def test_stochastic_divergence_is_seeded() -> None:
    def answers(seed: int) -> list[str]:
        knobs = MockKnobs(divergence_probability=0.5, seed=seed, token_delay_s=0.0)
        with MockServer(knobs=knobs) as server:
            return [
                _chat(server.base_url, "What is 2 + 2?").json()["choices"][0]["message"]["content"]
                for _ in range(12)
            ]

    first = answers(1)
    assert first == answers(1)
    assert set(first) == {"4", "5"}


def test_die_after_requests_drops_connections_and_check_alive_raises() -> None:
    with MockServer(knobs=MockKnobs(die_after_requests=1, token_delay_s=0.0)) as server:
        base = server.base_url
        assert _chat(base, "What is 1 + 1?").status_code == 200
        with pytest.raises(requests.ConnectionError):
            _chat(base, "What is 1 + 1?")
        with pytest.raises(InfraError):
            server.check_alive()


def test_launcher_describes_its_servers() -> None:
    launcher = MockLauncher(MockKnobs(bc_parallel_override=1))
    with launcher.launch("A", 1, 256) as a:
        assert "--parallel" in a.argv and a.metrics_enabled
        a.check_alive()
        assert a.info()["total_slots"] == 1
    with pytest.raises(InfraError):
        a.check_alive()
    with launcher.launch("BC", 4, 256) as bc:
        # The override serves one slot whatever was asked, and the argv says so.
        assert bc.info()["total_slots"] == 1
        assert bc.argv[bc.argv.index("--parallel") + 1] == "1"
        assert bc.kv_label.startswith("mock:")
    assert launcher.launches == 2
