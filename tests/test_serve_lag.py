"""A simulation with more events than the loop can process keeps the server answering.

At a speed whose decode steps come faster than Python can process them, the driver
processes the simulation in slices and falls behind real time (the
``simsim:simulation_lag_seconds`` gauge says by how much) instead of holding the event
loop: health checks, metrics and disconnects are still served.
"""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import pytest
from helpers import serve_backend
from prometheus_client.parser import text_string_to_metric_families

import simsim
from simsim.live import LiveServer, ServeOptions


def _gauge(page: str, name: str) -> float:
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} is not on the metrics page")


def test_a_simulation_behind_real_time_still_answers_and_reports_its_lag() -> None:
    # 1 us per decode step at 1000x: a billion steps per wall second, far beyond Python.
    engine = simsim.SimulationEngine(serve_backend(1))
    options = ServeOptions(max_model_len=2_000_000_000)
    with LiveServer(engine, speed=1000, options=options, port=0) as server:
        body = {"model": "simsim", "prompt": [1], "max_tokens": 1_000_000_000, "stream": True}
        with (
            httpx.Client(timeout=30) as client,
            client.stream("POST", f"{server.base_url}/completions", json=body) as stream,
        ):
            lines = stream.iter_lines()
            seen = 0
            for line in lines:
                seen += line.startswith("data: ")
                if seen == 1000:
                    break
            with httpx.Client(timeout=30) as other:
                assert other.get(f"{server.url}/health").status_code == 200
                page = other.get(f"{server.url}/metrics").text
            assert _gauge(page, "simsim:simulation_lag_seconds") > 0
        # Closing the stream cancels the request even while the simulation is behind.
        for _ in range(2000):
            if engine.requests[0].is_terminal:
                break
            with httpx.Client(timeout=30) as other:
                other.get(f"{server.url}/health")
    request = engine.requests[0]
    assert request.state is simsim.RequestState.CANCELLED
    assert 1000 <= request.generated_token_count < 1_000_000_000


def test_a_fast_stream_whose_client_hangs_up_writes_nothing_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Tokens produced together go out in one write, and none after the hang-up.

    At a high speed the simulation hands a stream its tokens in bursts. Written one
    send each, a burst that came after the client closed its socket made asyncio log
    "socket.send() raised exception." once per token (thousands of lines per request).
    """
    engine = simsim.SimulationEngine(serve_backend(50))
    body = json.dumps(
        {"model": "simsim", "prompt": [1, 2, 3], "max_tokens": 100_000, "stream": True}
    ).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: simsim\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        options = ServeOptions(max_model_len=200_000)
        with LiveServer(engine, speed=200, port=0, options=options) as server:
            for _ in range(5):
                with socket.create_connection((server.host, server.port), timeout=30) as client:
                    client.sendall(head + body)
                    received = b""
                    while received.count(b"data: ") < 2:
                        received += client.recv(65536)
                for _ in range(2000):  # until the server has seen the hang-up
                    if all(request.is_terminal for request in engine.requests.values()):
                        break
                    time.sleep(0.001)
        states = {request.state for request in engine.requests.values()}
    assert states == {simsim.RequestState.CANCELLED}
    assert [r.getMessage() for r in caplog.records if "socket.send()" in r.getMessage()] == []
