"""A [cluster] scenario served behind one OpenAI endpoint, routed as offline (issue 25,
point 1): the served run's request table and routes are the offline run's for the same
arrivals and cancellations."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest
from helpers import request_row, serve_backend, serving

import simsim
from simsim.live import replay, serving_engine
from simsim.scenario import load_scenario

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "scenarios"
SPEED = 50


def _table(server: simsim.Server) -> list[tuple[object, ...]]:
    requests = server.requests
    return [request_row(requests[rid]) for rid in sorted(requests)]


async def _clients(base_url: str, count: int) -> list[int]:
    """*count* concurrent streamed completions; each one's completion token count."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as api:

        async def one(index: int) -> int:
            stream = await api.completions.create(
                model="simsim",
                prompt="hello " * (8 + index),
                max_tokens=3 + index % 4,
                stream=True,
                stream_options={"include_usage": True},
            )
            tokens = 0
            async for chunk in stream:
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            return tokens

        return await asyncio.gather(*(one(index) for index in range(count)))


@pytest.mark.parametrize("example", ["cluster.toml", "disaggregated.toml"])
def test_a_cluster_is_served_behind_one_endpoint_and_routed_as_offline(example: str) -> None:
    scenario = load_scenario(EXAMPLES / example, require_requests=False)
    cluster = serving_engine(scenario)
    assert isinstance(cluster, simsim.Cluster)
    with serving(cluster, SPEED) as (server, http, _):
        tokens = asyncio.run(_clients(server.base_url, 12))
        page = http.get(f"{server.url}/metrics").text
    assert tokens == [3 + index % 4 for index in range(12)]
    assert "vllm:num_requests_running" in page and "vllm:kv_cache_usage_perc" in page
    frame = cluster.requests_frame()
    assert (frame["state"] == "FINISHED").all() and len(frame) == 12
    routes = cluster.routes_frame()
    assert routes["replica"].nunique() > 1  # the router spread the clients' requests
    offline = serving_engine(scenario)
    replay(server.actions, offline, until_us=server.stopped_at_us)
    assert isinstance(offline, simsim.Cluster)
    assert _table(offline) == _table(cluster)
    assert offline.routes_frame().equals(routes)


def test_a_served_cluster_refuses_work_past_the_lifetime_limit_and_goes_on() -> None:
    env = simsim.Environment()
    replicas = [simsim.SimulationEngine(serve_backend(10**7), env=env) for _ in "ab"]
    cluster = simsim.Cluster(replicas, "least_outstanding")
    options = simsim.live.ServeOptions(max_model_len=10**10)
    with serving(cluster, 100, options) as (server, http, _):
        url = f"{server.base_url}/completions"
        huge = {"model": "simsim", "prompt": "x", "max_tokens": 10**10 - 10}
        answer = http.post(url, json=huge)
        assert answer.status_code == 400
        assert "2,283 years" in answer.json()["error"]["message"]
        small = {"model": "simsim", "prompt": "x", "max_tokens": 2}
        assert http.post(url, json=small).status_code == 200
    assert cluster.max_request_lifetime_us == 2**56  # the driver set it
    assert list(cluster.requests) == [0]  # the refused request never reached it


def test_the_metrics_gauges_read_the_clusters_load() -> None:
    scenario = load_scenario(EXAMPLES / "cluster.toml", require_requests=False)
    cluster = serving_engine(scenario)
    with serving(cluster, SPEED) as (server, http, _):
        page = http.get(f"{server.url}/metrics").text
    assert 'vllm:num_requests_waiting{engine="0",model_name="simsim"} 0.0' in page
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="simsim"} 0.0' in page
