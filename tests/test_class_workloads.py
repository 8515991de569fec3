"""Workloads as a mix of request classes: merging, ids, metadata, seeds, counts, errors."""

from __future__ import annotations

from typing import Any

import pytest

import simsim
from simsim.workloads import (
    ClassMix,
    Fixed,
    FixedRateArrivals,
    OpenLoopWorkload,
    PatienceDeadline,
    PoissonArrivals,
    RequestClass,
    Uniform,
)


def chat(**changes: Any) -> RequestClass:
    fields: dict[str, Any] = {
        "name": "chat",
        "arrivals": PoissonArrivals(5.0),
        "prompt_tokens": Uniform(10, 100),
        "output_tokens": Uniform(1, 50),
        "count": 40,
        "tenant": "app",
        "priority": -1,
        "relative_deadline_us": 2_000_000,
        "ttft_slo_us": 200_000,
    }
    fields.update(changes)
    return RequestClass(**fields)


def batch(**changes: Any) -> RequestClass:
    fields: dict[str, Any] = {
        "name": "batch",
        "arrivals": PoissonArrivals(1.0),
        "prompt_tokens": Fixed(1000),
        "output_tokens": Uniform(100, 400),
        "count": 10,
        "priority": 3,
        "tags": {"job": "nightly", "shard": 2},
    }
    fields.update(changes)
    return RequestClass(**fields)


def draws(mix: ClassMix, name: str, seed: int = 7) -> list[tuple[int, int, int]]:
    """What class *name* drew: (arrival, prompt, output) in its own order."""
    return [
        (r.arrival_time_us, r.prompt_token_count, r.max_output_tokens)
        for r in mix.generate(seed).requests
        if r.request_class == name
    ]


def test_requests_merge_in_arrival_order_with_ids_that_follow_it() -> None:
    mix = ClassMix([chat(), batch()], first_request_id=100)
    requests = mix.generate(3).requests
    assert [r.request_id for r in requests] == list(range(100, 150))
    arrivals = [r.arrival_time_us for r in requests]
    assert arrivals == sorted(arrivals)
    assert {r.request_class for r in requests} == {"chat", "batch"}
    assert sum(r.request_class == "batch" for r in requests) == 10


def test_each_request_carries_its_class_metadata() -> None:
    for request in ClassMix([chat(), batch()]).generate(3).requests:
        if request.request_class == "chat":
            assert (request.tenant, request.priority, request.tags) == ("app", -1, None)
            assert request.deadline_us == request.arrival_time_us + 2_000_000
        else:
            assert (request.tenant, request.priority, request.deadline_us) == (None, 3, None)
            assert dict(request.tags or {}) == {"job": "nightly", "shard": 2}


def test_simultaneous_arrivals_go_in_class_order() -> None:
    every_second = {"arrivals": FixedRateArrivals(1.0), "count": 3}
    mix = ClassMix([batch(**every_second), chat(**every_second)])
    names = [(r.arrival_time_us, r.request_class) for r in mix.generate(0).requests]
    assert names == [
        (t, name) for t in (1_000_000, 2_000_000, 3_000_000) for name in ("batch", "chat")
    ]


def test_a_class_draws_the_same_whatever_other_classes_there_are() -> None:
    alone = ClassMix([chat()])
    assert draws(ClassMix([chat(), batch()]), "chat") == draws(alone, "chat")
    assert draws(ClassMix([batch(), chat()]), "chat") == draws(alone, "chat")
    # ... and exactly what an open-loop workload draws from the class's own seed.
    assert len(draws(alone, "chat")) == 40
    assert draws(alone, "chat") != draws(alone, "chat", seed=8)


def test_same_seed_same_requests() -> None:
    mix = ClassMix([chat(patience=Uniform(0, 3_000_000)), batch()])
    first, second = mix.generate(5), mix.generate(5)
    assert [vars_of(r) for r in first.requests] == [vars_of(r) for r in second.requests]
    assert first.cancellations == second.cancellations


def vars_of(request: simsim.Request) -> tuple[Any, ...]:
    return (
        request.request_id,
        request.arrival_time_us,
        request.prompt_token_count,
        request.max_output_tokens,
        request.request_class,
        request.priority,
        request.deadline_us,
    )


def test_patience_deadlines_follow_the_merged_ids() -> None:
    patient = chat(patience=Fixed(250_000))
    generated = ClassMix([batch(), patient]).generate(9)
    chats = [r for r in generated.requests if r.request_class == "chat"]
    assert generated.cancellations == tuple(
        PatienceDeadline(r.arrival_time_us + 250_000, r.request_id) for r in chats
    )


def test_a_total_is_split_by_arrival_rate_or_by_share() -> None:
    by_rate = ClassMix([chat(count=None), batch(count=None)], total=601)
    assert by_rate.counts() == [501, 100]  # 5:1, the remainder unit to the larger fraction
    by_share = ClassMix([chat(count=None, share=1), batch(count=None, share=2)], total=10)
    assert by_share.counts() == [3, 7]  # 3.33 and 6.67: the spare unit goes to 6.67
    assert by_share.count == len(by_share.generate(1).requests) == 10
    even = ClassMix([chat(count=None, share=1), batch(count=None, share=1)], total=3)
    assert even.counts() == [2, 1]  # a tie goes to the earlier class


def test_slo_targets_are_per_class() -> None:
    mix = ClassMix([chat(), batch(), batch(name="bulk", tpot_slo_us=50_000.5)])
    assert mix.slo_targets() == {"chat": (200_000.0, None), "bulk": (None, 50_000.5)}


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: ClassMix([]), ValueError, "at least one class"),
        (lambda: ClassMix([chat(), chat()]), ValueError, "'chat' appears twice"),
        (lambda: ClassMix([chat(count=None)]), ValueError, "class 'chat' has no count"),
        (lambda: ClassMix([chat()], total=5), ValueError, "class 'chat' has count = 40"),
        (lambda: chat(share=1.0), ValueError, "class 'chat': give count or share"),
        (lambda: chat(name=""), TypeError, "non-empty str name"),
        (lambda: chat(priority=1.5), TypeError, "priority must be an int"),
        (lambda: chat(tenant=""), TypeError, "tenant must be a non-empty str"),
        (lambda: chat(tags={"": 1}), TypeError, "tags must be a mapping"),
        (lambda: chat(relative_deadline_us=-1), ValueError, "relative_deadline_us"),
        (lambda: chat(prompt_tokens=5), TypeError, "class 'chat': prompt_tokens"),
        (lambda: ClassMix([chat()], first_request_id=2**63 - 10), OverflowError, "64-bit"),
        (lambda: ClassMix([chat(count=None)], total=0), ValueError, "^total must be >= 1, got 0$"),
        (lambda: chat(count=0), ValueError, "^class 'chat': count must be >= 1, got 0$"),
        (
            lambda: ClassMix([chat(count=6_000_000), chat(name="b", count=6_000_000)]),
            ValueError,
            "the classes make 12,000,000 requests, more than the limit of 10,000,000",
        ),
    ],
)
def test_bad_classes_are_refused_naming_the_class(build: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        build()


def test_a_class_whose_share_of_the_total_rounds_to_none_makes_no_request() -> None:
    mix = ClassMix([chat(count=None, share=1), chat(name="rare", count=None, share=0.01)], total=3)
    assert mix.counts() == [3, 0]
    requests = mix.generate(1).requests
    assert [r.request_class for r in requests] == ["chat"] * 3


def test_a_class_without_a_rate_needs_a_share() -> None:
    class Burst:
        def arrival_times_us(self, rng: Any, count: int, start_us: int = 0) -> Any:
            return FixedRateArrivals(10.0).arrival_times_us(rng, count, start_us)

    with pytest.raises(ValueError, match="class 'burst' has no share"):
        ClassMix([chat(count=None), chat(name="burst", arrivals=Burst(), count=None)], total=4)


def test_a_mix_runs_on_an_engine_and_its_frame_has_the_classes(
    backend: simsim.SimulatedBackend,
) -> None:
    engine = simsim.SimulationEngine(backend)
    ClassMix([chat(count=5), batch(count=2)]).submit_to(engine, seed=1)
    engine.run()
    frame = engine.requests_frame()
    assert sorted(frame["request_class"].value_counts().items()) == [("batch", 2), ("chat", 5)]
    assert (frame["state"] == "FINISHED").all()


def test_a_one_class_mix_draws_what_its_open_loop_workload_would() -> None:
    # The class's own seed is a child of the mix's seed; with it, the class is exactly
    # an OpenLoopWorkload, so every property of those carries over.
    from simsim.workloads.classes import _class_seed

    mix = ClassMix([chat()])
    plain = OpenLoopWorkload(PoissonArrivals(5.0), Uniform(10, 100), Uniform(1, 50), 40)
    expected = plain.generate(_class_seed(7, "chat")).requests
    assert draws(mix, "chat") == [
        (r.arrival_time_us, r.prompt_token_count, r.max_output_tokens) for r in expected
    ]
