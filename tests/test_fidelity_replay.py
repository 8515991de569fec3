"""``simsim replay``: a scenario played against a real HTTP server, measured in simsim's schema.

The servers are real :class:`~simsim.live.LiveServer` instances on a free port of
127.0.0.1, at speed 1 (replay plays in real time), with costs of tens of milliseconds so
that a workload's latencies are large next to the few milliseconds the HTTP layers add.
How the stream is read (which chunks are tokens, usage, errors) is checked against
``httpx.MockTransport`` streams shaped like llama.cpp's and vLLM's.

Tolerances, and why: the client and the served simulation share one process (and its
GIL) on a two-core machine that other test runs load too. A measured latency starts when
the client sends and ends when the token reaches it, so it can never be shorter than
what the server's own simulation recorded for the request; it is longer by the time the
request and the token spend in the HTTP layers and event loops: about 3 ms on an idle
machine, and (measured with two busy processes on the two cores) up to 90 ms for the odd
token the server's loop delivered late. So each request is held to the exact lower
bound and to :data:`OVERHEAD_US` above it (a client that timed in the wrong unit or
from the wrong zero breaks that), and against the offline simulation of the scenario
the *median* request must be within :data:`TOLERANCE_US` (a late send also shortens a
queued request's measured wait), and the median decode pace within 20%.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from helpers import engine_request_id

import simsim
from simsim.cli import main
from simsim.fidelity.measured import FAILED, StreamedCompletion
from simsim.fidelity.replay import (
    ReplayError,
    ReplayOptionError,
    ReplayOptions,
    completions_url,
    planned_requests,
    prompt_token_ids,
    replay_report,
    replay_scenario,
    server_root,
    stream_completion,
)
from simsim.live import LiveServer, ServeOptions
from simsim.results import requests_frame
from simsim.run_folder import read_run_folder, write_run_folder
from simsim.scenario import Scenario, ScenarioError, load_scenario, run_scenario
from simsim.scenario.model import Cancellation, RequestSpec

OVERHEAD_US = 200_000
"""How much longer than the server's own record a measured latency may be (see above)."""

TOLERANCE_US = 30_000
"""How far the median request's latency may be from the offline simulation's."""

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=20_000,
    prefill_per_token_us=100,
    prefill_per_active_sequence_us=0,
    decode_base_us=15_000,
    decode_per_active_sequence_us=0,
)
"""A lone request of p prompt tokens and n outputs: TTFT 35 ms + 0.1 ms x p, then 15 ms a token."""


def scenario(
    requests: list[tuple[int, int, int]],
    cancellations: tuple[Cancellation, ...] = (),
    engine: str = "single_slot",
) -> Scenario:
    """A scenario of ``(arrival_us, prompt, outputs)`` requests, ids 0, 1, ..., on :data:`COSTS`."""
    specs = tuple(RequestSpec(rid, *request) for rid, request in enumerate(requests))
    return Scenario(
        name="replayed", engine=engine, backend=COSTS, requests=specs, cancellations=cancellations
    )


@pytest.fixture
def served() -> Iterator[Callable[..., LiveServer]]:
    """Start a live server for a scenario's engine (speed 1); every one is stopped after."""
    servers: list[LiveServer] = []

    def start(of: Scenario, **options: Any) -> LiveServer:
        server = LiveServer(of.build_engine(), speed=1, port=0, options=ServeOptions(**options))
        servers.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


# ------------------------------------------------------------------ against simsim serve


def test_replay_matches_the_server_and_the_simulation_and_counts_tokens_exactly(
    served: Callable[..., LiveServer],
) -> None:
    # One slot, FCFS: requests 1, 2 and 4 queue behind the one before them.
    workload = scenario(
        [(0, 50, 4), (30_000, 80, 3), (60_000, 20, 5), (250_000, 120, 4), (300_000, 10, 2)]
    )
    server = served(workload)
    run = replay_scenario(workload, server.base_url)  # .../v1: the /v1 is accepted
    server.stop()  # stopped: its tables are final and readable here
    measured = run.requests.set_index("request_id")
    assert list(measured["state"]) == ["FINISHED"] * 5
    # Exact lengths: the server counted the prompts we meant, and generated every token.
    limits = measured["max_output_tokens"]
    assert measured["generated_token_count"].tolist() == limits.tolist()
    assert measured["chunk_token_count"].tolist() == limits.tolist()
    assert measured["usage_completion_tokens"].tolist() == limits.tolist()
    assert measured["usage_prompt_tokens"].tolist() == measured["prompt_token_count"].tolist()
    assert run.tokens.groupby("request_id").size().tolist() == limits.tolist()
    assert run.tokens.groupby("request_id")["token_index"].max().tolist() == limits.tolist()
    # Arrival is the actual send; lag is recorded apart; the first token is the tokens table's.
    assert (measured["send_lag_us"] >= 0).all()
    assert (measured["arrival_time_us"] - measured["send_lag_us"]).tolist() == (
        measured["scheduled_time_us"].tolist()
    )
    first = run.tokens[run.tokens["token_index"] == 1].set_index("request_id")["time_us"]
    assert measured["first_token_time_us"].tolist() == first.tolist()
    assert measured[["admit_time_us", "prefill_end_time_us"]].isna().all().all()

    served_table = server.engine.requests_frame().set_index("request_id")
    on_server = served_table.loc[[engine_request_id(rid) for rid in measured["response_id"]]]
    assert on_server["prompt_token_count"].tolist() == measured["prompt_token_count"].tolist()
    assert on_server["state"].tolist() == ["FINISHED"] * 5
    simulated = run_scenario(workload).requests_frame().set_index("request_id")
    for column in ("ttft_us", "e2e_latency_us"):
        # Both sides floor to whole microseconds, and the server's clock steps 1 us.
        extra = measured[column].to_numpy(dtype=np.int64) - on_server[column].to_numpy(np.int64)
        assert (extra >= -2).all(), (column, extra)
        assert (extra <= OVERHEAD_US).all(), (column, extra)
        off = (measured[column] - simulated[column]).astype("float64")
        assert off.abs().median() <= TOLERANCE_US, (column, off.tolist())
    pace = (measured["tpot_us"] / simulated["tpot_us"]).astype("float64").median()
    assert 0.8 <= pace <= 1.2, (measured["tpot_us"].tolist(), simulated["tpot_us"].tolist())


def test_cancellations_disconnect_and_the_server_cancels_them(
    served: Callable[..., LiveServer],
) -> None:
    # 0 is cut off while decoding, 1 while queued behind 0 (110 ms before 0 frees the
    # slot); 3 is cancelled at its arrival (never sent); 4 finishes before its cancellation.
    workload = scenario(
        [(0, 10, 30), (10_000, 10, 3), (20_000, 10, 2), (30_000, 10, 1), (250_000, 10, 2)],
        cancellations=(
            Cancellation(150_000, 0),
            Cancellation(40_000, 1),
            Cancellation(30_000, 3),
            Cancellation(5_000_000, 4),
        ),
    )
    server = served(workload)
    run = replay_scenario(workload, server.url)
    server.stop()
    measured = run.requests.set_index("request_id")
    assert measured["state"].tolist() == [
        "CANCELLED",
        "CANCELLED",
        "FINISHED",
        "CANCELLED",
        "FINISHED",
    ]
    assert measured["cancel_time_us"].tolist() == [150_000, 40_000, pd.NA, 30_000, 5_000_000]
    cut = measured.loc[0]
    assert 1 <= cut["generated_token_count"] < 30
    assert cut["generated_token_count"] == (run.tokens["request_id"] == 0).sum()
    for rid in (0, 1):  # ended when the client disconnected, at its cancellation time
        late = measured.loc[rid, "finish_time_us"] - measured.loc[rid, "cancel_time_us"]
        assert late >= 0
        assert late < OVERHEAD_US
    assert pd.isna(measured.loc[0, "e2e_latency_us"]) and pd.isna(measured.loc[1, "ttft_us"])
    never = measured.loc[3]
    assert pd.isna(never["send_lag_us"]) and pd.isna(never["http_status"])
    assert (never["arrival_time_us"], never["finish_time_us"]) == (30_000, 30_000)

    served_table = server.engine.requests_frame()
    assert len(served_table) == 4  # request 3 never reached the server
    states = served_table.set_index("request_id")["state"]
    assert states[engine_request_id(measured.loc[0, "response_id"])] == "CANCELLED"
    assert states[engine_request_id(measured.loc[2, "response_id"])] == "FINISHED"
    assert states[engine_request_id(measured.loc[4, "response_id"])] == "FINISHED"
    assert sorted(states) == ["CANCELLED", "CANCELLED", "FINISHED", "FINISHED"]
    queued = served_table[(served_table["state"] == "CANCELLED")]
    assert queued["admit_time_us"].isna().sum() == 1  # request 1, cancelled while queued


def test_the_cli_records_http_errors_writes_a_folder_that_reads_back_and_plots(
    served: Callable[..., LiveServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "replay.toml"
    lines = [
        "[scenario]",
        'name = "bursty"',
        "[backend]",
        *(f"{name} = {value}" for name, value in dataclasses.asdict(COSTS).items()),
    ]
    for rid in range(6):
        lines += ["[[requests]]", f"request_id = {rid}", f"arrival_time_us = {rid * 5_000}"]
        lines += ["prompt_token_count = 4", "max_output_tokens = 2"]
    path.write_text("\n".join(lines) + "\n")
    workload = load_scenario(path)
    server = served(workload, fail_rate=0.5, fail_status=503, fail_seed=3)
    out = tmp_path / "measured"
    status = main(["replay", str(path), "--url", server.url + "/", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 1, printed  # a request failed: the replay went on, and says so
    folder = read_run_folder(out)
    assert folder.tables == ("requests", "summary", "tokens")
    requests = folder.requests()
    failed = requests[requests["state"] == FAILED]
    assert 0 < len(failed) < 6, requests["state"].tolist()
    assert (failed["http_status"] == 503).all()
    assert failed["error"].str.startswith("HTTP 503: injected failure").all()
    assert failed[["ttft_us", "e2e_latency_us", "first_token_time_us"]].isna().all().all()
    assert (requests[requests["state"] == "FINISHED"]["generated_token_count"] == 2).all()
    assert f"{len(failed)} failed" in printed and "HTTP 503" in printed
    assert "send lag      max" in printed
    # The folder reads back with the frames' dtypes, and summarize works on it.
    summary = simsim.summarize(requests)
    assert summary.loc["requests", "value"] == 6
    assert summary.loc["count_FINISHED", "value"] == 6 - len(failed)
    assert folder.table("tokens").dtypes.to_dict() == {
        "request_id": np.dtype("int64"),
        "token_index": np.dtype("int64"),
        "time_us": pd.Int64Dtype(),
    }
    assert requests["error"].dtype == "str" and requests["send_lag_us"].dtype == "Int64"
    measured = folder.manifest["measured"]
    assert (measured["url"], measured["model"]) == (server.url, "simsim")
    assert folder.manifest["scenario"] == "bursty"
    assert main(["plot", str(out)]) == 0
    assert {p.name for p in out.glob("*.png")} == {"latency_cdf.png", "timeline.png", "gantt.png"}


def test_a_measured_run_round_trips_through_its_folder(
    served: Callable[..., LiveServer], tmp_path: Path
) -> None:
    workload = scenario([(0, 8, 2), (1_000, 8, 0)], cancellations=(Cancellation(0, 0),))
    server = served(workload)
    run = replay_scenario(workload, server.url, model="simsim")
    for fmt in ("csv", "parquet"):
        if fmt == "parquet":
            pytest.importorskip("pyarrow")
        run.write(tmp_path / fmt, format=fmt)  # type: ignore[arg-type]
        folder = read_run_folder(tmp_path / fmt)
        pd.testing.assert_frame_equal(folder.requests(), run.requests)
        pd.testing.assert_frame_equal(folder.table("tokens"), run.tokens)
    # A 0-token request finishes with its (empty) stream; no token rows.
    assert run.requests["state"].tolist() == ["CANCELLED", "FINISHED"]
    assert run.requests["generated_token_count"].tolist() == [0, 0]
    assert run.tokens.empty


# ------------------------------------------------------------------ reading a stream


def _sse(*chunks: Any, done: bool = True) -> bytes:
    events = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    return ("".join(events) + ("data: [DONE]\n\n" if done else "")).encode()


def _choice(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"id": "cmpl-x", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def _stream(response: httpx.Response, body: dict[str, Any] | None = None) -> StreamedCompletion:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return response

    async def go() -> StreamedCompletion:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await stream_completion(client, "http://server/v1/completions", body or {})

    result = asyncio.run(go())
    assert len(seen) == 1
    return result


def test_llama_cpp_streams_count_control_tokens_but_not_the_final_empty_chunk() -> None:
    usage = {"usage": {"prompt_tokens": 5, "completion_tokens": 3}}
    llama = _sse(
        _choice(" w1"),
        _choice(""),  # a sampled control token: no text, still a token
        _choice(" w2"),
        {**_choice("", "length"), **usage},  # llama.cpp's last chunk: no token
    )
    result = _stream(httpx.Response(200, content=llama))
    assert len(result.token_times_us) == 3 and result.generated_token_count == 3
    assert (result.finish_reason, result.usage_prompt_tokens, result.error) == ("length", 5, None)
    assert result.response_id == "cmpl-x" and result.sent_us == 0
    assert result.ttft_us == result.token_times_us[0] >= 0


def test_vllm_streams_end_with_a_usage_chunk_and_usage_wins_over_chunks() -> None:
    vllm = _sse(
        _choice(" a"),
        _choice(" b c", "length"),  # two tokens in one chunk: usage says so
        {"id": "cmpl-x", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}},
    )
    result = _stream(httpx.Response(200, content=vllm))
    assert len(result.token_times_us) == 2
    assert result.generated_token_count == 3


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (
            httpx.Response(400, json={"error": {"message": "prompt too long", "type": "x"}}),
            "HTTP 400: prompt too long",
        ),
        (httpx.Response(502, content=b"bad gateway"), "HTTP 502: bad gateway"),
        (
            httpx.Response(200, content=_sse(_choice(" a"), {"error": {"message": "stopping"}})),
            "error chunk: stopping",
        ),
        (httpx.Response(200, content=b"data: {not json\n\n"), "JSONDecodeError"),
        (
            httpx.Response(200, content=_sse(_choice(" a"), done=False)),
            "ended after 1 token with neither a finish_reason nor [DONE]",
        ),
    ],
)
def test_a_failed_request_is_a_result_with_its_error(response: httpx.Response, error: str) -> None:
    result = _stream(response)
    assert result.error is not None and error in result.error
    assert not result.cancelled


def test_a_refused_connection_is_recorded_for_every_request() -> None:
    port = _free_port()
    run = replay_scenario(
        scenario([(0, 3, 2), (1_000, 3, 2)]), f"http://127.0.0.1:{port}", model="m"
    )
    assert run.requests["state"].tolist() == [FAILED, FAILED]
    assert run.requests["error"].str.startswith("ConnectError").all()
    assert run.requests["http_status"].isna().all()
    assert "2 failed" in replay_report(run)


# ------------------------------------------------------------------ request bodies


def test_bodies_ask_for_exact_lengths_with_fresh_prompts_per_request() -> None:
    options = ReplayOptions(
        token_ids=(10, 12), ban_tokens=(0, 2), extra_body={"cache_prompt": False}
    )
    body = options.body("m", [10, 11], 7)
    assert body == {
        "model": "m",
        "prompt": [10, 11],
        "max_tokens": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "min_tokens": 7,
        "logit_bias": {"0": -100, "2": -100},
        "cache_prompt": False,
    }
    assert "ignore_eos" not in ReplayOptions(exact_output=False).body("m", [], 1)
    ids = prompt_token_ids(2000, np.random.default_rng(1), (10, 12))
    assert set(ids) == {10, 11, 12} and len(ids) == 2000


def test_the_prompt_seed_fixes_the_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    bodies: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "first"}]})
        bodies.append(json.loads(request.content))
        assert request.headers["connection"] == "close"
        return httpx.Response(200, content=_sse(_choice(" a", "length")))

    # Every connection replay opens goes to the handler instead of the network.
    monkeypatch.setattr(httpx, "AsyncHTTPTransport", lambda **_: httpx.MockTransport(handler))
    workload = scenario([(0, 6, 1), (0, 6, 1)])
    for seed in (5, 5, None):
        run = replay_scenario(workload, "http://server:1", options=ReplayOptions(prompt_seed=seed))
        assert run.requests["state"].tolist() == ["FINISHED", "FINISHED"]
    prompts = [tuple(body["prompt"]) for body in bodies]
    assert {body["model"] for body in bodies} == {"first"}  # the first listed model
    assert prompts[0] != prompts[1]  # requests differ
    assert sorted(prompts[:2]) == sorted(prompts[2:4])  # the same seed, the same prompts
    assert not set(prompts[4:]) & set(prompts[:2])  # a fresh seed, fresh prompts
    assert all(len(p) == 6 and all(3 <= t <= 1002 for t in p) for p in prompts)


@pytest.mark.parametrize("models_status", [200, 404])
def test_the_model_list_is_read_before_time_zero_even_for_a_named_model(
    monkeypatch: pytest.MonkeyPatch, models_status: int
) -> None:
    # The client's one-time set-up happens on that first request, not on request 0's.
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path == "/v1/models":
            return httpx.Response(models_status, json={"data": [{"id": "listed"}]})
        assert json.loads(request.content)["model"] == "named"
        return httpx.Response(200, content=_sse(_choice(" a", "length")))

    monkeypatch.setattr(httpx, "AsyncHTTPTransport", lambda **_: httpx.MockTransport(handler))
    run = replay_scenario(scenario([(0, 2, 1)]), "http://server:1", model="named")
    assert paths == ["/v1/models", "/v1/completions"]
    assert run.requests["state"].tolist() == ["FINISHED"]
    assert run.measured["model"] == "named"


def test_the_manifest_takes_extra_keys_but_not_standard_ones(tmp_path: Path) -> None:
    frame = requests_frame([])
    write_run_folder(tmp_path, {"requests": frame}, extra={"measured": {"url": "u"}})
    assert read_run_folder(tmp_path).manifest["measured"] == {"url": "u"}
    with pytest.raises(ValueError, match=r"extra manifest keys \['seed'\] would replace"):
        write_run_folder(tmp_path / "x", {"requests": frame}, extra={"seed": 3})
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_run_folder(tmp_path / "x", {"requests": frame}, extra={"measured": {1, 2}})
    assert not (tmp_path / "x").exists()  # refused before anything was written


# ------------------------------------------------------------------ bad arguments


def test_urls_are_normalised_and_bad_ones_named() -> None:
    for url in (
        "http://h:8000",
        "http://h:8000/",
        "http://h:8000/v1",
        "http://h:8000/v1/",
        "http://h:8000/v1/completions",
    ):
        assert server_root(url) == "http://h:8000"
    assert completions_url("https://h/proxy/v1") == "https://h/proxy/v1/completions"
    for bad, rule in (
        ("ftp://h", "must be an http:// or https:// URL"),
        ("h:8000", "must be an http:// or https:// URL"),
        ("http://h/?q=1", "query or fragment"),
    ):
        with pytest.raises(ValueError, match=rule) as caught:
            server_root(bad)
        assert repr(bad) in str(caught.value)


@pytest.mark.parametrize(
    ("options", "field", "rule"),
    [
        ({"token_ids": (5, 2)}, "token_ids", "0 <= lowest <= highest"),
        ({"token_ids": (-1, 2)}, "token_ids", "got \\(-1, 2\\)"),
        ({"prompt_seed": -1}, "prompt_seed", "integer >= 0"),
        ({"ban_tokens": (1, "x")}, "ban_tokens", "token ids >= 0"),
        ({"extra_body": {"max_tokens": 3}}, "extra_body", "may not set \\['max_tokens'\\]"),
        ({"extra_body": {"x": float("nan")}}, "extra_body", "JSON values only"),
        ({"extra_body": {"logit_bias": {}}, "ban_tokens": (2,)}, "extra_body", "one place"),
        ({"timeout_s": 0}, "timeout_s", "positive number"),
    ],
)
def test_bad_options_are_named(options: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(ReplayOptionError, match=rule) as caught:
        ReplayOptions(**options)
    assert caught.value.field == field


def test_a_closed_loop_workload_and_a_scenario_without_requests_are_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "closed.toml"
    path.write_text(
        "[backend]\nprefill_base_us = 1\n[workload]\nkind = 'closed_loop'\nusers = 2\n"
        "requests_per_user = 2\nthink_time_us = 0\nprompt_tokens = 1\noutput_tokens = 1\n"
    )
    with pytest.raises(ScenarioError, match="closed-loop workload cannot be replayed"):
        planned_requests(load_scenario(path))
    with pytest.raises(ScenarioError, match="no requests to replay"):
        replay_scenario(Scenario(), "http://127.0.0.1:1")


@pytest.mark.parametrize(
    ("arguments", "names"),
    [
        (["--token-ids", "7"], "--token-ids: must be LOW-HIGH"),
        (["--token-ids", "9-3"], "--token-ids: must be (lowest, highest)"),
        (["--ban-tokens", "1,x"], "--ban-tokens: must be comma-separated token ids"),
        (["--extra-body", "{"], "--extra-body: is not JSON"),
        (["--extra-body", '{"stream": false}'], "--extra-body: may not set ['stream']"),
        (["--timeout", "-1"], "--timeout: must be a positive number"),
        (["--url", "127.0.0.1:8000"], "--url: url '127.0.0.1:8000' must be an http://"),
    ],
)
def test_bad_replay_flags_exit_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], names: str
) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        "[backend]\nprefill_base_us = 1\n[[requests]]\nrequest_id = 0\narrival_time_us = 0\n"
        "prompt_token_count = 1\nmax_output_tokens = 1\n"
    )
    base = ["replay", str(path), "--url", "http://127.0.0.1:1", "--out", str(tmp_path / "o")]
    assert main([*base, *arguments]) == 2
    assert f"simsim: error: {names}" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_an_unreachable_server_without_a_model_name_stops_the_replay() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(ReplayError, match=r"cannot reach .*/v1/models .*give the model name"):
        replay_scenario(scenario([(0, 1, 1)]), url)


def _free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_a_workload_file_needs_no_backend_table_to_be_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server measured is the cost model: replay reads only the requests."""
    workload = tmp_path / "w.toml"
    workload.write_text(
        "[[requests]]\nrequest_id = 0\narrival_time_us = 0\nprompt_token_count = 3\n"
        "max_output_tokens = 2\n",
        encoding="utf-8",
    )
    url = f"http://127.0.0.1:{_free_port()}"
    status = main(["replay", str(workload), "--url", url, "--out", str(tmp_path / "m")])
    assert status == 1  # read and planned; then the server cannot be reached
    assert "cannot reach" in capsys.readouterr().err
