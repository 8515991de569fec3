"""How the live server counts tokens and reads requests (``docs/serve.md``).

Unit tests of ``simsim/live/tokens.py`` (the simsim word tokenizer, the chat rule, the
filler text) and of the app's request parsing: every rule and error the guide documents,
checked through Starlette's ``TestClient`` against an app whose simulation runs a
thousand times faster than real time. No socket is opened.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

import simsim
from simsim.live import LiveDriver, ServeOptions, ServerMetrics, create_app
from simsim.live.tokens import (
    FILLER_WORDS,
    chat_text,
    count_text_tokens,
    filler_text,
    filler_token,
)

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=100,
    prefill_per_token_us=2,
    prefill_per_active_sequence_us=0,
    decode_base_us=10,
    decode_per_active_sequence_us=0,
)

# ---------------------------------------------------------------------------- tokens


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("Hello, world!", 4),  # Hello , world !
        ("", 0),
        (" \t\n ", 0),
        ("don't", 3),  # don ' t
        ("snake_case_name 42", 2),  # underscores and digits are word characters
        ("3.14", 3),  # 3 . 14
        ("a+b=c", 5),
        ("héllo wörld", 2),  # letters of any script
        ("🙂🙂", 2),  # a symbol is one token per character
        ("user: Hi there\n", 4),  # user : Hi there
    ],
)
def test_the_simsim_word_tokenizer(text: str, tokens: int) -> None:
    assert count_text_tokens(text) == tokens


def test_filler_text_has_exactly_its_token_count() -> None:
    assert filler_text(0) == ""
    assert filler_text(5) == " the quick brown fox jumps"
    for count in range(60):
        assert count_text_tokens(filler_text(count)) == count
    # Token n (from 1) is word (n - 1) % 17, after a space; the words cycle.
    assert len(FILLER_WORDS) == 17
    assert filler_token(1) == filler_token(18) == " the"
    assert filler_text(20) == "".join(filler_token(n) for n in range(1, 21))


def test_a_chat_prompt_is_role_colon_content_per_message() -> None:
    text = chat_text([("system", "Be brief."), ("user", "Hi")])
    assert text == "system: Be brief.\nuser: Hi\n"
    assert count_text_tokens(text) == 8  # system : Be brief . user : Hi


# ---------------------------------------------------------------------------- the app


@pytest.fixture
def serve() -> Iterator[Any]:
    """``serve(**options)`` -> (TestClient, driver, metrics); each server is stopped."""
    clients: list[TestClient] = []

    def start(**options: Any) -> tuple[TestClient, LiveDriver, ServerMetrics]:
        engine = simsim.SimulationEngine(simsim.SimulatedBackend(COSTS))
        driver = LiveDriver(engine, speed=1000.0)
        metrics = ServerMetrics("simsim", driver.counts, driver.kv_cache_usage)
        driver.observer = metrics
        client = TestClient(create_app(driver, metrics, ServeOptions(**options)))
        client.__enter__()  # runs the lifespan: the driver starts
        clients.append(client)
        return client, driver, metrics

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def _post(client: TestClient, path: str, body: Any) -> Any:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=content, headers={"content-type": "application/json"})


def _completion(**fields: Any) -> dict[str, Any]:
    return {"model": "simsim", "prompt": "x", "max_tokens": 1, **fields}


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "simsim", "messages": [{"role": "user", "content": "x"}], **fields}


BAD_COMPLETIONS: list[tuple[str, Any, int, str | None, str | None]] = [
    # (case, body, status, param, code)
    ("not JSON", b"{not json", 400, None, None),
    ("not an object", b"[1, 2]", 400, None, None),
    ("unknown field", _completion(frobnicate=1), 400, "frobnicate", None),
    ("a chat field", _completion(messages=[]), 400, "messages", None),
    ("no model", {"prompt": "x"}, 400, "model", None),
    ("another model", _completion(model="gpt-4o"), 404, "model", "model_not_found"),
    ("negative max_tokens", _completion(max_tokens=-1), 400, "max_tokens", None),
    ("float max_tokens", _completion(max_tokens=1.5), 400, "max_tokens", None),
    ("bool max_tokens", _completion(max_tokens=True), 400, "max_tokens", None),
    ("string max_tokens", _completion(max_tokens="3"), 400, "max_tokens", None),
    ("n = 2", _completion(n=2), 400, "n", None),
    ("best_of = 2", _completion(best_of=2), 400, "best_of", None),
    ("echo", _completion(echo=True), 400, "echo", None),
    ("logprobs", _completion(logprobs=1), 400, "logprobs", None),
    ("suffix", _completion(suffix="!"), 400, "suffix", None),
    ("stream not a bool", _completion(stream="yes"), 400, "stream", None),
    (
        "stream_options without stream",
        _completion(stream_options={"include_usage": True}),
        400,
        "stream_options",
        None,
    ),
    (
        "unknown stream option",
        _completion(stream=True, stream_options={"detail": True}),
        400,
        "stream_options",
        None,
    ),
    ("two prompts", _completion(prompt=["a", "b"]), 400, "prompt", None),
    ("mixed prompt list", _completion(prompt=[1, "a"]), 400, "prompt", None),
    ("number prompt", _completion(prompt=5), 400, "prompt", None),
    (
        "over the context limit",
        _completion(prompt=list(range(8)), max_tokens=9),
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    (
        "prompt alone over the limit",
        _completion(prompt=list(range(17)), max_tokens=0),
        400,
        "prompt",
        "context_length_exceeded",
    ),
]

BAD_CHATS: list[tuple[str, Any, int, str | None, str | None]] = [
    ("a completion field", _chat(prompt="x"), 400, "prompt", None),
    ("no messages", {"model": "simsim"}, 400, "messages", None),
    ("empty messages", _chat(messages=[]), 400, "messages", None),
    ("message without role", _chat(messages=[{"content": "x"}]), 400, "messages[0]", None),
    (
        "an image part",
        _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        400,
        "messages[0]",
        None,
    ),
    ("number content", _chat(messages=[{"role": "user", "content": 7}]), 400, "messages[0]", None),
    (
        "negative max_completion_tokens",
        _chat(max_completion_tokens=-2),
        400,
        "max_completion_tokens",
        None,
    ),
    (
        "over the context limit",
        _chat(messages=[{"role": "user", "content": "x " * 20}]),
        400,
        "messages",
        "context_length_exceeded",
    ),
]


def _check_refused(
    serve: Any, path: str, body: Any, status: int, param: str | None, code: str | None
) -> None:
    client, driver, _ = serve(max_model_len=16)
    answer = _post(client, path, body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert (error["param"], error["code"]) == (param, code)
    assert driver.engine.requests == {}  # refused before the simulation saw it


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [case[1:] for case in BAD_COMPLETIONS],
    ids=[case[0] for case in BAD_COMPLETIONS],
)
def test_a_bad_completion_request_gets_an_openai_error(
    serve: Any, body: Any, status: int, param: str | None, code: str | None
) -> None:
    _check_refused(serve, "/v1/completions", body, status, param, code)


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [case[1:] for case in BAD_CHATS],
    ids=[case[0] for case in BAD_CHATS],
)
def test_a_bad_chat_request_gets_an_openai_error(
    serve: Any, body: Any, status: int, param: str | None, code: str | None
) -> None:
    _check_refused(serve, "/v1/chat/completions", body, status, param, code)


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [
        ("Hello, world!", 4),
        ([101, 2023, 2003], 3),  # token ids count exactly, whatever their values
        ([], 0),
        ([[7, 8]], 2),  # a list holding one prompt
        (["Hi there"], 2),
    ],
)
def test_the_prompt_is_counted_by_the_documented_rule(serve: Any, prompt: Any, tokens: int) -> None:
    client, driver, _ = serve()
    answer = _post(client, "/v1/completions", _completion(prompt=prompt, max_tokens=3))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["usage"] == {
        "prompt_tokens": tokens,
        "completion_tokens": 3,
        "total_tokens": tokens + 3,
    }
    assert body["choices"][0]["text"] == filler_text(3)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["id"] == "cmpl-0"  # the request's id in the request table
    assert driver.engine.requests[0].prompt_token_count == tokens


def test_a_chat_prompt_is_counted_by_the_chat_rule(serve: Any) -> None:
    client, _, _ = serve()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
    ]
    answer = _post(client, "/v1/chat/completions", _chat(messages=messages, max_tokens=2))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    # "system: Be brief.\nuser: a b\nassistant: \n": 5 + 4 + 2 tokens.
    assert body["usage"]["prompt_tokens"] == 11
    assert body["choices"][0]["message"] == {"role": "assistant", "content": filler_text(2)}
    assert body["id"] == "chatcmpl-0"


def test_output_length_default_and_max_completion_tokens(serve: Any) -> None:
    client, _, _ = serve()
    plain = _post(client, "/v1/completions", {"model": "simsim", "prompt": "x"}).json()
    assert plain["usage"]["completion_tokens"] == 16  # OpenAI's default max_tokens
    chat = _post(client, "/v1/chat/completions", _chat(max_tokens=9, max_completion_tokens=2))
    assert chat.json()["usage"]["completion_tokens"] == 2  # the newer field wins
    empty = _post(client, "/v1/completions", _completion(max_tokens=0)).json()
    assert empty["choices"][0]["text"] == ""
    assert empty["choices"][0]["finish_reason"] == "length"


def test_sampling_fields_are_accepted_and_ignored(serve: Any) -> None:
    client, _, _ = serve()
    sampling = {
        "temperature": 0.0,
        "top_p": 0.9,
        "top_k": 5,
        "seed": 1,
        "stop": ["\n"],
        "presence_penalty": 1.0,
        "frequency_penalty": 1.0,
        "ignore_eos": True,
        "user": "someone",
    }
    answer = _post(client, "/v1/completions", _completion(max_tokens=4, **sampling))
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == filler_text(4)


def test_hints_that_newer_openai_clients_and_vllm_users_send_are_accepted(serve: Any) -> None:
    client, _, _ = serve()
    hints = {
        "prompt_cache_key": "conversation-7",
        "safety_identifier": "user-hash",
        "service_tier": "auto",
        "metadata": {"team": "gateway"},
        "store": False,
        "priority": 3,
        "request_id": "abc",
        "cache_salt": "s",
    }
    chat_only = {
        "verbosity": "low",
        "modalities": ["text"],
        "prediction": None,
        "web_search_options": None,
        "audio": None,
        "reasoning_effort": "low",
    }
    answer = _post(client, "/v1/completions", _completion(max_tokens=2, **hints))
    assert answer.status_code == 200, answer.text
    answer = _post(client, "/v1/chat/completions", _chat(max_tokens=2, **hints, **chat_only))
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", "hot"),
        ("top_p", True),
        ("seed", 1.5),
        ("top_k", "5"),
        ("stop", 7),
        ("user", 42),
        ("ignore_eos", "yes"),
        ("logit_bias", [1, 2]),
        ("metadata", "x"),
    ],
)
def test_ignored_fields_of_the_wrong_type_are_refused(serve: Any, field: str, value: Any) -> None:
    client, driver, _ = serve()
    answer = _post(client, "/v1/completions", _completion(**{field: value}))
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == field and repr(value) in error["message"]
    assert driver.engine.requests == {}


def test_include_usage_and_token_ids_are_checked(serve: Any) -> None:
    client, driver, _ = serve()
    body = _completion(stream=True, stream_options={"include_usage": "x"})
    answer = _post(client, "/v1/completions", body)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "stream_options"
    answer = _post(client, "/v1/completions", _completion(prompt=[1, -2, 3]))
    assert answer.status_code == 400
    assert "token ids must be integers >= 0" in answer.json()["error"]["message"]
    assert driver.engine.requests == {}


def test_a_stream_sends_one_chunk_per_token_then_usage_and_done(serve: Any) -> None:
    client, _, _ = serve()
    body = _chat(max_tokens=3, stream=True, stream_options={"include_usage": True})
    answer = _post(client, "/v1/chat/completions", body)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in answer.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks[:3]]
    assert deltas == [
        {"role": "assistant", "content": " the"},
        {"content": " quick"},
        {"content": " brown"},
    ]
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks[:3]] == [None, None, "length"]
    assert chunks[3]["choices"] == []
    assert chunks[3]["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


def test_a_full_queue_answers_429_with_retry_after(serve: Any) -> None:
    client, driver, metrics = serve(max_waiting=1, retry_after_s=7)
    # Two long prefills on the single slot: at least one of them waits from now on.
    for _ in range(2):
        client.portal.call(driver.submit, 10**10, 1)
    answer = _post(client, "/v1/completions", _completion())
    assert answer.status_code == 429
    assert answer.headers["retry-after"] == "7"
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "queue_full")
    # A bad request is still a 400: requests are read before the queue is checked.
    assert _post(client, "/v1/completions", _completion(n=3)).status_code == 400
    assert sorted(driver.engine.requests) == [0, 1]  # the refused ones never arrived
    page = client.portal.call(metrics.render).decode()
    rejected = 'simsim:rejected_requests_total{engine="0",model_name="simsim",reason='
    assert rejected + '"queue_full"} 1.0' in page
    assert 'reason="bad_request"} 1.0' in page


def test_injected_failures_draw_once_per_valid_request_from_the_seed(serve: Any) -> None:
    client, driver, metrics = serve(fail_rate=0.5, fail_status=503, fail_seed=11)
    draws = random.Random(11)
    expected, statuses = [], []
    for index in range(12):
        if index % 3 == 0:  # invalid requests in between take no draw
            assert _post(client, "/v1/completions", _completion(n=2)).status_code == 400
        expected.append(503 if draws.random() < 0.5 else 200)
        statuses.append(_post(client, "/v1/completions", _completion(max_tokens=0)).status_code)
    assert statuses == expected
    assert 200 in statuses and 503 in statuses
    # Failed requests never reach the simulation; they are counted as rejected.
    assert len(driver.engine.requests) == statuses.count(200)
    page = client.portal.call(metrics.render).decode()
    assert f'reason="injected_failure"}} {statuses.count(503)}.0' in page


def test_a_stream_of_zero_tokens_sends_one_empty_chunk_with_the_finish_reason(
    serve: Any,
) -> None:
    client, _, _ = serve()
    answer = _post(client, "/v1/completions", _completion(max_tokens=0, stream=True))
    events = [line[6:] for line in answer.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    (chunk,) = [json.loads(event) for event in events[:-1]]
    assert chunk["choices"] == [
        {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
    ]


def test_a_request_the_engine_refuses_gets_400_and_changes_nothing() -> None:
    # A context limit above the KV cache's capacity lets through a request that can
    # never fit in the cache; the engine refuses it at submit.
    engine = simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=2,
        kv_cache=simsim.KvCacheConfig(block_size_tokens=4, total_blocks=4),
    )
    driver = LiveDriver(engine, speed=1000.0)
    metrics = ServerMetrics("simsim", driver.counts, driver.kv_cache_usage)
    driver.observer = metrics
    with TestClient(create_app(driver, metrics, ServeOptions(max_model_len=100))) as client:
        answer = _post(client, "/v1/completions", _completion(prompt=list(range(20))))
        assert answer.status_code == 400
        assert "more than the whole cache" in answer.json()["error"]["message"]
        assert engine.requests == {}
        ok = _post(client, "/v1/completions", _completion(prompt=[1, 2]))
        assert ok.status_code == 200 and ok.json()["id"] == "cmpl-0"
    assert 'reason="bad_request"} 1.0' in metrics.render().decode()


def test_import_simsim_leaves_the_live_layer_to_first_use() -> None:
    """``import simsim`` works without the serve extra; ``simsim.live`` imports it."""
    code = (
        "import sys, simsim\n"
        "assert 'simsim.live' not in sys.modules and 'uvicorn' not in sys.modules\n"
        "assert simsim.live.LiveServer.__name__ == 'LiveServer'\n"
        "try:\n    simsim.no_such_name\nexcept AttributeError as error:\n    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "module 'simsim' has no attribute 'no_such_name'"
