"""A scenario's admission control, scheduler and prefix cache under ``simsim serve``.

Each test serves a real :class:`~simsim.live.LiveServer` on a free port of 127.0.0.1 and
calls it with the ``openai`` client and ``httpx``: a request the admission control turns
away is answered 429 in OpenAI's shape (plain and streamed), a request's ``priority``
reaches a priority scheduler, and a prefix cache says on the model card that it never
hits over HTTP. What is checked is the answer and the request table, never how long
anything took.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import openai
import pytest
from helpers import HeldStream, engine_request_id, serve_backend, serving, wait_for
from prometheus_client.parser import text_string_to_metric_families

import simsim
from simsim.admission import AdmissionControl, Limit
from simsim.live import LiveServer, ServeOptions, replay
from simsim.schedulers import PriorityScheduler

MODEL = "simsim"


def _counters(page: str) -> dict[tuple[str, str], float]:
    """``(name, reason or finished_reason)`` -> value of the refusal and ending counters."""
    values: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name in ("simsim:rejected_requests_total", "vllm:request_success_total"):
                label = sample.labels.get("reason") or sample.labels["finished_reason"]
                values[(sample.name, label)] = sample.value
    return values


def _error_of(response: httpx.Response) -> dict[str, Any]:
    """OpenAI's error object of *response*, with exactly its keys."""
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


# --------------------------------------------------------------------------- admission control


def test_the_refill_time_is_the_bucket_s_exact_wait() -> None:
    # 3 tokens a second, burst 1 (simsim.admission's own example): a bucket emptied at
    # 0 holds a whole token again from 333,334 us.
    control = AdmissionControl({"*": Limit(rate_per_s=3, burst=1)})
    engine = simsim.SimulationEngine(serve_backend(1_000), admission=control)
    for rid, arrival in ((0, 0), (1, 100_000)):
        engine.submit(simsim.Request(rid, arrival, 1, 1))
    engine.env.run(until=100_001)
    assert engine.requests[1].rejection == "rate_limited"
    assert engine.rate_limit_refill_us(1) == 333_334 - 100_001
    engine.env.run(until=333_334)
    assert engine.rate_limit_refill_us(1) == 0
    never = simsim.SimulationEngine(
        serve_backend(1_000), admission=AdmissionControl({"*": Limit(rate_per_s=0, burst=1)})
    )
    never.submit(simsim.Request(0, 0, 1, 1))
    never.run()
    assert never.rate_limit_refill_us(0) is None  # a bucket at rate 0 never refills
    queue_only = simsim.SimulationEngine(
        serve_backend(1_000), admission=AdmissionControl({"*": Limit(max_queued=1)})
    )
    queue_only.submit(simsim.Request(0, 0, 1, 1))
    assert queue_only.rate_limit_refill_us(0) is None  # no rate: nothing to refill
    plain = simsim.SimulationEngine(serve_backend(1_000))
    plain.submit(simsim.Request(0, 0, 1, 1))
    assert plain.rate_limit_refill_us(0) is None
    with pytest.raises(simsim.UnknownRequestError, match="request 5"):
        plain.rate_limit_refill_us(5)


def test_a_cluster_tells_the_refill_time_of_its_own_control() -> None:
    control = AdmissionControl({"*": Limit(rate_per_s=3, burst=1)})
    env = simsim.Environment()
    cluster = simsim.Cluster(
        [simsim.SimulationEngine(serve_backend(1_000), env=env) for _ in range(2)],
        "round_robin",
        admission=control,
    )
    for rid, arrival in ((0, 0), (1, 100_000)):
        cluster.submit(simsim.Request(rid, arrival, 1, 1))
    env.run(until=100_001)
    assert cluster.requests[1].rejection == "rate_limited"
    assert cluster.rate_limit_refill_us(1) == 333_334 - 100_001
    with pytest.raises(simsim.UnknownRequestError, match="request 7"):
        cluster.rate_limit_refill_us(7)
    plain = simsim.Cluster([simsim.SimulationEngine(serve_backend(1_000))], "round_robin")
    plain.submit(simsim.Request(0, 0, 1, 1))
    assert plain.rate_limit_refill_us(0) is None


def test_a_rate_limited_request_is_answered_429_plain_and_streamed() -> None:
    # One token per 100,000 simulated seconds: after the first request the bucket is
    # empty for 1,000 wall seconds at speed 100, far longer than the test takes.
    speed = 100
    control = AdmissionControl({"*": Limit(rate_per_s=0.00001, burst=1)})
    engine = simsim.SimulationEngine(serve_backend(1_000), admission=control)
    with (
        serving(engine, speed, ServeOptions(retry_after_s=1)) as (server, http, _),
        openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client,
    ):
        first = client.completions.create(model=MODEL, prompt="a", max_tokens=2)
        assert first.usage is not None and first.usage.completion_tokens == 2
        with pytest.raises(openai.RateLimitError) as plain:
            client.completions.create(model=MODEL, prompt="b", max_tokens=2)
        with pytest.raises(openai.RateLimitError) as streamed:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "c"}], stream=True
            )
        with http.stream(
            "POST",
            f"{server.base_url}/completions",
            json={"model": MODEL, "prompt": "d", "stream": True},
        ) as raw:
            raw.read()
        page = server.metrics_text()
    for refused in (plain.value.response, streamed.value.response, raw):
        assert refused.status_code == 429
        error = _error_of(refused)
        assert (error["type"], error["param"], error["code"]) == (
            "rate_limit_error",
            None,
            "rate_limited",
        )
        assert "'*'" in error["message"] and "rate_per_s = 1e-05" in error["message"]
    table = engine.requests_frame()
    assert list(table["state"]) == ["FINISHED", "CANCELLED", "CANCELLED", "CANCELLED"]
    assert list(table["rejection"].fillna("-")) == [
        "-",
        "rate_limited",
        "rate_limited",
        "rate_limited",
    ]
    # Retry-After: the wall seconds until the bucket holds a token, from the moment the
    # refusal is known (a simulated microsecond after the arrival) or a moment later.
    emptied_us = int(table["arrival_time_us"][0])
    refused_us = int(table["arrival_time_us"][1])
    latest = math.ceil((emptied_us + 100_000_000_000 - (refused_us + 1)) / (speed * 1_000_000))
    assert latest >= 990  # far from --retry-after's 1: the header is the bucket's
    assert latest - 1 <= int(plain.value.response.headers["retry-after"]) <= latest
    counted = _counters(page)
    assert counted[("simsim:rejected_requests_total", "rate_limited")] == 3
    assert counted[("vllm:request_success_total", "length")] == 1
    assert counted.get(("vllm:request_success_total", "abort"), 0) == 0


def test_a_full_admission_queue_is_answered_429_with_retry_after() -> None:
    control = AdmissionControl({"*": Limit(max_queued=1)})
    engine = simsim.SimulationEngine(serve_backend(100_000), admission=control)
    with (
        serving(engine, 20, ServeOptions(retry_after_s=4)) as (server, http, stack),
        openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client,
    ):
        running = HeldStream(stack, http, server.base_url, prompt="a", max_tokens=2000)
        running.read(1)
        queued = HeldStream(stack, http, server.base_url, prompt="b", max_tokens=2000)
        plain = http.post(f"{server.base_url}/completions", json={"model": MODEL, "prompt": "c"})
        with pytest.raises(openai.RateLimitError) as streamed:
            client.completions.create(model=MODEL, prompt="d", stream=True)
        running.close()
        queued.close()
        wait_for(lambda: len(server.actions) == 6, "both held requests to be cancelled")
        page = server.metrics_text()
    for refused in (plain, streamed.value.response):
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "4"  # no bucket: --retry-after
        error = _error_of(refused)
        assert (error["type"], error["code"]) == ("rate_limit_error", "queue_full")
        assert "'*' has max_queued = 1" in error["message"]
    assert list(engine.requests_frame()["rejection"].fillna("-")) == [
        "-",
        "-",
        "queue_full",
        "queue_full",
    ]
    counted = _counters(page)
    assert counted[("simsim:rejected_requests_total", "queue_full")] == 2
    assert counted[("vllm:request_success_total", "abort")] == 2  # the two closed streams


# --------------------------------------------------------------------------- priority


def test_a_priority_scheduler_orders_served_requests_by_their_priority() -> None:
    def fresh() -> simsim.SimulationEngine:
        return simsim.SimulationEngine(serve_backend(100_000), PriorityScheduler())

    engine = fresh()
    with (
        serving(engine, 20) as (server, http, stack),
        openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client,
    ):
        running = HeldStream(stack, http, server.base_url, prompt="a", max_tokens=2000)
        running.read(1)
        # Queued behind it: a low priority first, then an urgent one (lower runs first).
        later = HeldStream(stack, http, server.base_url, prompt="b", max_tokens=2000, priority=5)
        urgent = client.completions.create(
            model=MODEL, prompt="c", max_tokens=2000, stream=True, extra_body={"priority": -1}
        )
        stack.callback(urgent.close)
        running.close()
        first = next(iter(urgent))  # the freed slot goes to the urgent request
        urgent_id = engine_request_id(first.id)
        urgent.close()
        later.read(1)
        later.close()
        wait_for(lambda: len(server.actions) == 6, "every request to be cancelled")
    table = engine.requests_frame().set_index("request_id")
    assert urgent_id == 2
    assert table["admit_time_us"][2] < table["admit_time_us"][1]
    assert list(engine.admissions_frame()["request_id"]) == [0, 2, 1]
    assert [engine.requests[rid].priority for rid in (0, 1, 2)] == [0, 5, -1]
    # The session's actions carry the priorities: replayed offline, the same table.
    offline = fresh()
    replay(server.actions, offline, until_us=server.stopped_at_us)
    assert offline.requests_frame().equals(engine.requests_frame())


# --------------------------------------------------------------------------- prefix cache


def _prefix_caching_engine(prefix_cache: bool) -> simsim.BatchingEngine:
    return simsim.BatchingEngine(
        serve_backend(1_000),
        max_active_requests=4,
        kv_cache=simsim.KvCacheConfig(block_size_tokens=16, total_blocks=64),
        prefix_cache=prefix_cache,
    )


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_the_model_card_says_a_prefix_cache_never_hits_over_http(prefix_cache: bool) -> None:
    engine = _prefix_caching_engine(prefix_cache)
    with LiveServer(engine, speed=50, port=0) as server:
        cards = httpx.get(f"{server.base_url}/models", timeout=30).json()["data"]
        card = httpx.get(f"{server.base_url}/models/{MODEL}", timeout=30).json()
        # The same prompt twice: a prefix cache would serve the second from the first.
        for _ in range(2):
            httpx.post(
                f"{server.base_url}/completions",
                json={"model": MODEL, "prompt": [7] * 40, "max_tokens": 1},
                timeout=30,
            ).raise_for_status()
    assert cards == [card]
    assert [request.cached_prompt_token_count for request in engine.requests.values()] == [0, 0]
    if prefix_cache:
        note = card["prefix_caching"]
        assert (note["enabled"], note["hits_over_http"]) == (True, False)
        assert "never serves a prompt token over HTTP" in note["note"]
    else:
        assert "prefix_caching" not in card
