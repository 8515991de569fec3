"""``BatchingEngine(first_token_at_prefill=True)``: the first token at the prefill's end.

The cost model is ``tests/test_batching.py``'s (microseconds)::

    prefill of n tokens by 1 request  = 105 + 2n      decode of 1 request  = 13
    prefill of n tokens by 2 requests = 110 + 2n      decode of 2 requests = 16

Every expected timestamp is worked out by hand in the comments. Records are compared as
``(timestamp_us, event_type, request_id)``.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_batching import ARR, COSTS, DEC, PF, PRE, RC
from test_batching_properties import configs, request_specs

import simsim
from simsim import EventType as E
from simsim import RequestState as S
from simsim.scenario import ScenarioError, parse_scenario


def engine(**options: Any) -> simsim.BatchingEngine:
    options.setdefault("max_active_requests", 4)
    options.setdefault("first_token_at_prefill", True)
    return simsim.BatchingEngine(simsim.SimulatedBackend(COSTS), **options)


def submit(server: simsim.BatchingEngine, *specs: tuple[int, int, int, int]) -> None:
    for rid, arrival, prompt, output in specs:
        server.submit(simsim.Request(rid, arrival, prompt, output))


def log(server: simsim.BatchingEngine) -> list[tuple[int, E, int]]:
    records = server.event_log
    sequences = [(rec.timestamp_us, rec.sequence) for rec in records]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    return [(rec.timestamp_us, rec.event_type, rec.request_id) for rec in records]


def test_off_by_default_and_checked() -> None:
    assert engine(first_token_at_prefill=False).first_token_at_prefill is False
    assert (
        simsim.BatchingEngine(
            simsim.SimulatedBackend(COSTS), max_active_requests=1
        ).first_token_at_prefill
        is False
    )
    with pytest.raises(TypeError, match="first_token_at_prefill must be True or False, got 1"):
        engine(first_token_at_prefill=1)


def test_single_request_takes_its_first_token_from_the_prefill() -> None:
    server = engine()
    submit(server, (0, 0, 10, 3))
    server.run()
    # prefill 10 tokens: 105 + 20 = 125, with token 1; decodes 138 (token 2), 151 (token 3)
    assert log(server) == [
        (0, ARR, 0),
        (125, PF, 0),
        (125, DEC, 0),
        (138, DEC, 0),
        (151, DEC, 0),
        (151, RC, 0),
    ]
    request = server.requests[0]
    assert (request.prefill_end_time_us, request.first_token_time_us) == (125, 125)
    assert (request.finish_time_us, request.generated_token_count) == (151, 3)
    # the iterations are priced as without the option: one prefill, then decodes
    frame = server.iterations_frame()
    assert frame[["start_us", "end_us", "prefill_tokens", "decoding_count"]].values.tolist() == [
        [0, 125, 10, 0],
        [125, 138, 0, 1],
        [138, 151, 0, 1],
    ]


def test_the_default_still_takes_it_from_the_next_iteration() -> None:
    server = engine(first_token_at_prefill=False)
    submit(server, (0, 0, 10, 3))
    server.run()
    assert [(t, kind) for t, kind, _ in log(server)][1:3] == [(125, PF), (138, DEC)]
    assert server.requests[0].first_token_time_us == 138


def test_two_requests_with_chunked_prefill_under_mixed() -> None:
    server = engine(max_active_requests=2, max_batch_tokens=8, policy="mixed")
    submit(server, (0, 0, 10, 2), (1, 0, 4, 2))
    server.run()
    # 0..121: request 0 prefills 8 of 10 tokens (105 + 16); request 1 gets no budget.
    # 121..243: request 0's last 2 and request 1's 4 tokens (110 + 12): both prefills end,
    # each with its first token. 243..259: both decode (16) their second and last token.
    assert log(server) == [
        (0, ARR, 0),
        (0, ARR, 1),
        (243, PF, 0),
        (243, DEC, 0),
        (243, PF, 1),
        (243, DEC, 1),
        (259, DEC, 0),
        (259, RC, 0),
        (259, DEC, 1),
        (259, RC, 1),
    ]
    for rid in (0, 1):
        assert server.requests[rid].first_token_time_us == 243
    assert server.iterations_frame()["end_us"].tolist() == [121, 243, 259]


def test_a_readmission_after_preemption_samples_a_token_at_its_prefill() -> None:
    cache = simsim.KvCacheConfig(block_size_tokens=4, total_blocks=4)
    server = engine(max_active_requests=2, kv_cache=cache)
    submit(server, (0, 0, 4, 6), (1, 0, 4, 6))
    server.run()
    # 0..126: both prefill (110 + 16), 2 blocks each (4 prompt + 1 token), token 1 each.
    # Decodes of two (16): 142, 158, 174 (4 tokens each, 8 in cache). At 174 request 0
    # needs a third block: request 1 (the latest admitted) is preempted. Request 0
    # decodes alone (13): 187, 200 (token 6, finished). At 200 request 1 is readmitted
    # and recomputes 4 + 4 tokens (105 + 16 = 121): its prefill ends at 321 with token 5;
    # one more decode (13) ends it at 334.
    assert [record for record in log(server) if record[2] == 1] == [
        (0, ARR, 1),
        (126, PF, 1),
        (126, DEC, 1),
        (142, DEC, 1),
        (158, DEC, 1),
        (174, DEC, 1),
        (174, PRE, 1),
        (321, PF, 1),
        (321, DEC, 1),
        (334, DEC, 1),
        (334, RC, 1),
    ]
    request = server.requests[1]
    assert (request.admit_time_us, request.first_token_time_us) == (0, 126)
    assert (request.prefill_end_time_us, request.finish_time_us) == (321, 334)
    assert [(rec.timestamp_us, rec.request_id) for rec in server.admission_log][-1] == (200, 1)
    assert server.requests[0].finish_time_us == 200


def test_cancellation_right_after_the_prefill_iteration_keeps_the_token() -> None:
    server = engine()
    submit(server, (0, 0, 10, 5))
    while server.now_us < 125:
        server.run_next_timestamp()
    request = server.requests[0]
    assert (request.state, request.generated_token_count) == (S.DECODING, 1)
    server.cancel_request(0)
    server.run()
    assert log(server) == [(0, ARR, 0), (125, PF, 0), (125, DEC, 0)]
    assert (request.state, request.first_token_time_us, request.finish_time_us) == (
        S.CANCELLED,
        125,
        125,
    )
    assert request.generated_token_count == 1


@pytest.mark.parametrize(
    ("output", "tail"), [(0, [(125, RC, 0)]), (1, [(125, DEC, 0), (125, RC, 0)])]
)
def test_zero_and_one_token_outputs(output: int, tail: list[tuple[int, E, int]]) -> None:
    server = engine()
    submit(server, (0, 0, 10, output))
    server.run()
    assert log(server) == [(0, ARR, 0), (125, PF, 0), *tail]
    request = server.requests[0]
    assert request.generated_token_count == output
    assert request.first_token_time_us == (None if output == 0 else 125)


def test_token_events_fire_at_the_prefill_end() -> None:
    server = engine()
    submit(server, (0, 0, 10, 2))
    seen: list[tuple[int, int]] = []

    def watch() -> Any:
        for number in (1, 2):
            yield server.token(0, number)
            seen.append((number, server.now_us))

    server.env.process(watch())
    server.run()
    assert seen == [(1, 125), (2, 138)]


def test_scenario_key_builds_the_engine_and_disaggregation_refuses_it() -> None:
    document: dict[str, Any] = {
        "scenario": {"engine": "batching"},
        "backend": {"prefill_base_us": 100, "decode_base_us": 10},
        "batching": {"max_active_requests": 4, "first_token_at_prefill": True},
        "requests": [
            {"request_id": 0, "arrival_time_us": 0, "prompt_token_count": 4, "max_output_tokens": 2}
        ],
    }
    scenario = parse_scenario(document)
    for built in (scenario.build(), scenario.build_served()):  # simsim run, simsim serve
        assert isinstance(built, simsim.BatchingEngine) and built.first_token_at_prefill
    document["batching"]["first_token_at_prefill"] = "yes"
    with pytest.raises(
        ScenarioError, match=r"batching\.first_token_at_prefill: must be true or false"
    ):
        parse_scenario(document)
    document["batching"]["first_token_at_prefill"] = True
    document["cluster"] = {
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
        "transfer": {"kv_bytes_per_token": 1, "bandwidth_bytes_per_s": 1},
    }
    with pytest.raises(ScenarioError, match="not supported with disaggregated prefill"):
        parse_scenario(document)


def test_a_disaggregated_cluster_refuses_the_option() -> None:
    with pytest.raises(ValueError, match=r"prefill\[0\] has first_token_at_prefill=True"):
        simsim.DisaggregatedCluster(
            [engine()],
            [engine(first_token_at_prefill=False)],
            simsim.KvTransferConfig(kv_bytes_per_token=1, bandwidth_bytes_per_s=1),
        )


# ------------------------------------------------------------------------- property


@st.composite
def setups(draw: Any) -> tuple[Any, ...]:
    config = draw(configs())
    slots = draw(st.integers(1, 6))
    policy = draw(st.sampled_from(["prefill_first", "mixed"]))
    cap = draw(st.integers(slots, slots + 64)) if policy == "mixed" else None
    ids = list(range(draw(st.integers(1, 12))))
    specs = draw(request_specs(ids, pressure=draw(st.booleans())))
    cache = None
    if draw(st.booleans()):
        block = draw(st.integers(1, 8))
        biggest = max(s.prompt_token_count + s.max_output_tokens for s in specs)
        need = max(1, -(-biggest // block))
        cache = simsim.KvCacheConfig(block, draw(st.integers(need, 3 * need + 4)))
    return config, slots, policy, cap, cache, specs


@settings(
    max_examples=examples(150),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(setups())
def test_every_prefill_end_gives_a_token_and_tokens_are_conserved(setup: tuple[Any, ...]) -> None:
    config, slots, policy, cap, cache, specs = setup
    server = simsim.BatchingEngine(
        simsim.SimulatedBackend(config),
        max_active_requests=slots,
        max_batch_tokens=cap,
        policy=policy,
        kv_cache=cache,
        first_token_at_prefill=True,
    )
    for spec in specs:
        server.submit(spec.make())
    server.run()
    assert server.kv_blocks_in_use == 0
    records = log(server)
    by_request: dict[int, list[tuple[int, E]]] = {}
    for time_us, kind, rid in records:
        by_request.setdefault(rid, []).append((time_us, kind))
    for rid, request in server.requests.items():
        assert request.state is S.FINISHED
        own = by_request[rid]
        decodes = [t for t, kind in own if kind is DEC]
        assert len(decodes) == request.generated_token_count == request.max_output_tokens
        # each prefill end of a request with tokens to go comes with a token, at once
        for index, (time_us, kind) in enumerate(own):
            if kind is PF and request.max_output_tokens > 0:
                assert own[index + 1] == (time_us, DEC), (rid, own)
        if request.max_output_tokens and not any(kind is PRE for _, kind in own):
            assert request.first_token_time_us == request.prefill_end_time_us
        assert own[-1] == (request.finish_time_us, RC)
