"""One request spec: ``RequestSpec`` owns a request's fields; everything else follows it."""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import Any

import numpy as np
import pytest

import simsim
from simsim.engines.base import queued_request
from simsim.request import (
    METADATA_FIELDS,
    SPEC_FIELDS,
    RequestSpec,
    request_spec,
    submitted_request,
)
from simsim.results import METADATA_COLUMNS, REQUEST_COLUMNS

# A value for every field, none of them the default (extend it when a field is added).
EVERY_FIELD: dict[str, Any] = {
    "request_id": 7,
    "arrival_time_us": 100,
    "prompt_token_count": 32,
    "max_output_tokens": 3,
    "block_hashes": ("a", "b"),
    "request_class": "chat",
    "tenant": "acme",
    "priority": -2,
    "deadline_us": 5_000,
    "tags": {"team": "search"},
}
SIZES = SPEC_FIELDS[:4]


def spec_of(values: dict[str, Any]) -> RequestSpec:
    return RequestSpec(*(values[name] for name in SIZES), **{
        name: values[name] for name in SPEC_FIELDS[4:]
    })  # fmt: skip


def test_the_example_names_every_field_of_the_spec() -> None:
    assert tuple(EVERY_FIELD) == SPEC_FIELDS == tuple(f.name for f in fields(RequestSpec))
    assert SIZES == (
        "request_id",
        "arrival_time_us",
        "prompt_token_count",
        "max_output_tokens",
    )


def test_every_spec_field_is_a_request_attribute_and_constructor_argument() -> None:
    parameters = inspect.signature(simsim.Request).parameters
    for spec_field in fields(RequestSpec):
        parameter = parameters[spec_field.name]
        if spec_field.name in SIZES:
            assert parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        else:
            assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, spec_field.name
            assert parameter.default == spec_field.default, spec_field.name
    request = simsim.Request(1, 0, 1, 1)
    assert all(hasattr(request, name) for name in SPEC_FIELDS)


def test_a_spec_and_a_request_built_from_the_same_fields_round_trip() -> None:
    spec = spec_of(EVERY_FIELD)
    direct = simsim.Request(
        *(EVERY_FIELD[name] for name in SIZES),
        **{name: EVERY_FIELD[name] for name in SPEC_FIELDS[4:]},
    )
    made = submitted_request(spec)
    assert made == direct and made.is_pristine
    for name in SPEC_FIELDS:
        assert getattr(made, name) == getattr(direct, name) == getattr(spec, name), name
    assert request_spec(direct) == spec
    assert request_spec(made) is spec  # made once: the request keeps its spec
    assert spec.has_metadata and direct.has_metadata
    assert set(METADATA_FIELDS) == set(SPEC_FIELDS[5:])


def test_the_queued_request_is_the_spec_and_carries_every_field() -> None:
    assert simsim.QueuedRequest is RequestSpec
    seen: list[simsim.QueuedRequest] = []

    class Recording(simsim.FcfsScheduler):
        def enqueue(self, item: simsim.QueuedRequest) -> None:
            seen.append(item)
            super().enqueue(item)

    engine = simsim.SimulationEngine(
        simsim.SimulatedBackend(simsim.SimulatedBackendConfig(1, 1, 0, 1, 0)), Recording()
    )
    spec = spec_of(EVERY_FIELD | {"block_hashes": None})
    plain = simsim.Request(8, 100, 4, 1, tenant="acme")
    engine.submit(spec)
    engine.submit(plain)
    engine.run()
    assert seen[0] is spec  # the submitted spec, not a copy checked again
    assert seen[1] == RequestSpec(8, 100, 4, 1, tenant="acme") == queued_request(plain)
    for name in SPEC_FIELDS:
        assert getattr(seen[0], name) == getattr(engine.requests[7], name), name


def test_the_requests_frame_has_a_column_for_every_size_and_metadata_field() -> None:
    backend = simsim.SimulatedBackend(simsim.SimulatedBackendConfig(1, 1, 0, 1, 0))
    engine = simsim.SimulationEngine(backend)
    engine.submit(spec_of(EVERY_FIELD | {"block_hashes": None}))
    engine.run()
    frame = engine.requests_frame()
    assert set(SIZES) <= set(REQUEST_COLUMNS)
    # Tags become one column per key; every other metadata field is a column of its own.
    assert tuple(name for name in METADATA_FIELDS if name != "tags") == METADATA_COLUMNS
    assert list(frame.columns) == [*REQUEST_COLUMNS, *METADATA_COLUMNS, "tag_team"]
    row = frame.iloc[0]
    for name in (*SIZES, *METADATA_COLUMNS):
        assert row[name] == EVERY_FIELD[name], name


def test_submit_of_a_spec_returns_a_new_request_each_time() -> None:
    backend = simsim.SimulatedBackend(simsim.SimulatedBackendConfig(1, 1, 0, 1, 0))
    spec = RequestSpec(0, 0, 4, 2)
    first, second = simsim.SimulationEngine(backend), simsim.Cluster([
        simsim.SimulationEngine(backend)
    ])  # fmt: skip
    made = [first.submit(spec), second.submit(spec)]
    assert made[0] is not made[1] and made[0] == made[1] == simsim.Request(0, 0, 4, 2)
    with pytest.raises(ValueError, match="request 0 was already submitted to this engine"):
        first.submit(spec)
    with pytest.raises(
        TypeError, match=r"submit takes a simsim\.Request or simsim\.RequestSpec, got tuple"
    ):
        first.submit((1, 0, 4, 2))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arguments", "keywords", "error", "message"),
    [
        ((-1, 0, 1, 1), {}, ValueError, "request_id"),
        ((0, 1.5, 1, 1), {}, TypeError, "arrival_time_us"),
        ((0, 0, 1, 1), {"block_hashes": [1, 1]}, ValueError, "request 0: block_hashes repeats"),
        ((0, 0, 1, 1), {"tenant": ""}, TypeError, "request 0: tenant must be a non-empty"),
        ((0, 0, 1, 1), {"priority": True}, TypeError, "request 0: priority must be an int"),
        ((0, 0, 1, 1), {"deadline_us": -1}, ValueError, "request 0: deadline_us"),
    ],
)
def test_a_spec_is_checked_as_a_request_is(
    arguments: tuple[Any, ...], keywords: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as from_spec:
        RequestSpec(*arguments, **keywords)
    with pytest.raises(error) as from_request:
        simsim.Request(*arguments, **keywords)
    assert str(from_spec.value) == str(from_request.value)


def test_a_spec_normalises_as_a_request_does() -> None:
    numbers: Any = (np.int64(3), np.int64(10), np.int32(2))
    spec = RequestSpec(numbers[0], numbers[1], 1, 1, priority=numbers[2], tags={"k": 1})
    assert type(spec.request_id) is type(spec.arrival_time_us) is type(spec.priority) is int
    with pytest.raises(TypeError):
        spec.tags["k"] = 2  # type: ignore[index]
    with pytest.raises(AttributeError):
        spec.priority = 3  # type: ignore[misc]
