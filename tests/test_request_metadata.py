"""Request metadata: class, tenant, priority, deadline and tags reach schedulers and frames."""

from __future__ import annotations

import pytest

import simsim
from simsim.results import METADATA_COLUMNS, REQUEST_COLUMNS

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=1_000,
    prefill_per_token_us=10,
    prefill_per_active_sequence_us=0,
    decode_base_us=2_000,
    decode_per_active_sequence_us=0,
)


def test_metadata_is_checked_and_kept() -> None:
    request = simsim.Request(
        0,
        arrival_time_us=0,
        prompt_token_count=8,
        max_output_tokens=2,
        request_class="chat",
        tenant="acme",
        priority=-3,
        deadline_us=50_000,
        tags={"region": "eu", "turn": 2},
    )
    assert request.has_metadata
    assert (request.request_class, request.tenant, request.priority) == ("chat", "acme", -3)
    assert dict(request.tags or {}) == {"region": "eu", "turn": 2}
    with pytest.raises(TypeError):
        request.tags["region"] = "us"  # type: ignore[index]
    plain = simsim.Request(1, arrival_time_us=0, prompt_token_count=8, max_output_tokens=2)
    assert not plain.has_metadata
    assert "tenant" not in repr(request)


@pytest.mark.parametrize(
    ("keyword", "value", "error"),
    [
        ("request_class", "", TypeError),
        ("tenant", 7, TypeError),
        ("priority", True, TypeError),
        ("priority", 1.5, TypeError),
        ("deadline_us", -1, ValueError),
        ("tags", {1: "x"}, TypeError),
        ("tags", ["x"], TypeError),
    ],
)
def test_bad_metadata_is_refused_naming_the_field(
    keyword: str, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match=keyword):
        simsim.Request(
            0, arrival_time_us=0, prompt_token_count=8, max_output_tokens=2, **{keyword: value}
        )  # type: ignore[arg-type]


def test_schedulers_see_the_metadata() -> None:
    seen: list[simsim.QueuedRequest] = []

    class Spy(simsim.FcfsScheduler):
        def enqueue(self, item: simsim.QueuedRequest) -> None:
            seen.append(item)
            super().enqueue(item)

    engine = simsim.SimulationEngine(simsim.SimulatedBackend(COSTS), Spy())
    engine.submit(
        simsim.Request(
            0, arrival_time_us=0, prompt_token_count=8, max_output_tokens=2, tenant="a", priority=4
        )
    )
    engine.submit(simsim.Request(1, arrival_time_us=0, prompt_token_count=8, max_output_tokens=2))
    engine.run()
    assert [(q.tenant, q.priority, q.request_class, q.deadline_us) for q in seen] == [
        ("a", 4, None, None),
        (None, 0, None, None),
    ]


def test_frames_gain_metadata_columns_only_when_a_request_has_metadata() -> None:
    engine = simsim.BatchingEngine(simsim.SimulatedBackend(COSTS), max_active_requests=2)
    engine.submit(simsim.Request(0, arrival_time_us=0, prompt_token_count=8, max_output_tokens=2))
    engine.run()
    assert tuple(engine.requests_frame().columns) == REQUEST_COLUMNS
    engine.submit(
        simsim.Request(
            1,
            arrival_time_us=10_000,
            prompt_token_count=8,
            max_output_tokens=2,
            request_class="batch",
            deadline_us=90_000,
            tags={"job": "nightly"},
        )
    )
    engine.run()
    frame = engine.requests_frame()
    assert tuple(frame.columns) == REQUEST_COLUMNS + METADATA_COLUMNS + ("tag_job",)
    assert frame["request_class"].tolist()[1] == "batch"
    assert frame["request_class"].isna().tolist() == [True, False]
    assert frame["deadline_us"].tolist()[1] == 90_000
    assert frame["tag_job"].tolist() == [None, "nightly"]
    assert frame["priority"].tolist() == [0, 0]
