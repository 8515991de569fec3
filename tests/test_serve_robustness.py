"""What a reviewer found a live server must survive, each kept fixed by a test.

One client's odd request (JSON nested too deeply, an output that would run past the
64-bit clock, a body it never finishes sending) must get an answer or nothing, never a
traceback, and never stop the simulation for the others; the simulation is read only
from the server's own thread while it runs.
"""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import openai
import pytest
from helpers import serve_backend

import simsim
from simsim.live import LiveServer, ServeOptions
from simsim.live.wire import MAX_MODEL_LEN, OptionError


def _engine() -> simsim.SimulationEngine:
    return simsim.SimulationEngine(serve_backend(1_000))


def test_the_driver_is_read_from_the_server_s_thread_or_after_it_stopped() -> None:
    with LiveServer(_engine(), speed=50, port=0) as server:
        httpx.post(
            f"{server.base_url}/completions",
            json={"model": "simsim", "prompt": "x", "max_tokens": 2},
            timeout=30,
        ).raise_for_status()
        with pytest.raises(RuntimeError, match="another thread"):
            server.driver.counts()
        with pytest.raises(RuntimeError, match="another thread"):
            server.metrics.render()
        page = server.metrics_text()  # rendered on the server's loop
        assert "vllm:generation_tokens_total" in page
    assert server.driver.counts() == (0, 0)
    assert server.metrics_text() == server.metrics.render().decode()


def test_json_nested_too_deeply_is_a_400() -> None:
    with LiveServer(_engine(), speed=50, port=0) as server:
        answer = httpx.post(f"{server.base_url}/completions", content=b"[" * 100_000, timeout=30)
        assert answer.status_code == 400
        assert "nested too deeply" in answer.json()["error"]["message"]


def test_an_output_past_the_clock_is_refused_and_the_simulation_goes_on() -> None:
    costs = simsim.SimulatedBackendConfig(
        prefill_base_us=1_000,
        prefill_per_token_us=1,
        prefill_per_active_sequence_us=0,
        decode_base_us=10**7,
        decode_per_active_sequence_us=0,
    )
    for engine in (
        simsim.SimulationEngine(simsim.SimulatedBackend(costs)),
        simsim.BatchingEngine(simsim.SimulatedBackend(costs), max_active_requests=2),
    ):
        options = ServeOptions(max_model_len=MAX_MODEL_LEN)
        with LiveServer(engine, speed=100, port=0, options=options) as server:
            url = f"{server.base_url}/completions"
            huge = {"model": "simsim", "prompt": "x", "max_tokens": MAX_MODEL_LEN - 10}
            answer = httpx.post(url, json=huge, timeout=30)
            assert answer.status_code == 400
            assert "2,283 years" in answer.json()["error"]["message"]
            small = {"model": "simsim", "prompt": "x", "max_tokens": 2}
            assert httpx.post(url, json=small, timeout=30).status_code == 200
            assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
        assert len(engine.requests) == 1 and not engine.failed


def test_a_client_gone_before_its_body_is_read_leaves_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level(logging.ERROR),
        LiveServer(_engine(), speed=50, port=0) as server,
    ):
        for _ in range(3):
            with socket.create_connection((server.host, server.port), timeout=30) as client:
                client.sendall(
                    b"POST /v1/completions HTTP/1.1\r\nHost: simsim\r\n"
                    b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"mo'
                )
        page = ""
        for _ in range(2000):  # until the server has seen all three go
            page = server.metrics_text()
            if 'reason="client_disconnect"} 3.0' in page:
                break
            time.sleep(0.005)
    assert 'reason="client_disconnect"} 3.0' in page
    assert server.engine.requests == {}
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]


def test_one_model_is_retrieved_by_name() -> None:
    with LiveServer(_engine(), speed=50, port=0, options=ServeOptions(model="org/tiny")) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        card = client.models.retrieve("org/tiny")
        assert (card.id, card.owned_by) == ("org/tiny", "simsim")
        with pytest.raises(openai.NotFoundError) as caught:
            client.models.retrieve("other")
        assert caught.value.status_code == 404


def test_vllm_s_request_extras_are_accepted() -> None:
    extras = {
        "chat_template_kwargs": {"enable_thinking": False},
        "add_generation_prompt": True,
        "include_stop_str_in_output": False,
        "guided_json": {"type": "object"},
        "structured_outputs": None,
        "guided_decoding_backend": "xgrammar",
        "prompt_logprobs": None,
        "use_beam_search": False,
    }
    with LiveServer(_engine(), speed=50, port=0) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        chat = client.chat.completions.create(
            model="simsim",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_body=extras,
        )
        assert chat.usage is not None and chat.usage.completion_tokens == 2
        # ... but not the values that would ask for what simsim cannot give
        for refused in ({"prompt_logprobs": 3}, {"use_beam_search": True}):
            with pytest.raises(openai.BadRequestError) as caught:
                client.completions.create(
                    model="simsim", prompt="hi", max_tokens=1, extra_body=refused
                )
            assert caught.value.body["param"] == next(iter(refused))  # type: ignore[index]


def test_an_injected_429_is_a_rate_limit_error() -> None:
    options = ServeOptions(fail_rate=1.0, fail_status=429, retry_after_s=3)
    with LiveServer(_engine(), speed=50, port=0, options=options) as server:
        body = {"model": "simsim", "prompt": "x", "max_tokens": 1}
        answer = httpx.post(f"{server.base_url}/completions", json=body, timeout=30)
    assert answer.status_code == 429
    assert answer.headers["Retry-After"] == "3"
    assert answer.json()["error"]["type"] == "rate_limit_error"
    assert json.loads(answer.text)["error"]["code"] == "injected_failure"


def test_option_errors_name_their_field() -> None:
    with pytest.raises(OptionError) as caught:
        ServeOptions(max_model_len=MAX_MODEL_LEN + 1)
    assert caught.value.field == "max_model_len"
    assert caught.value.rule == f"must be at most {MAX_MODEL_LEN}, got {MAX_MODEL_LEN + 1}"
    with pytest.raises(ValueError, match="fail_rate must be a number from 0 to 1"):
        ServeOptions(fail_rate=True)
