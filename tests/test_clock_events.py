"""The clock's event helpers: processed, boundary and scheduled events (issue 25, point 8)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
import simpy

from simsim.clock import Environment, ScheduledEvent


def test_a_processed_event_resumes_a_process_at_once_with_its_value() -> None:
    env = Environment()
    event = env.processed_event("done")
    assert event.processed and event.ok and event.value == "done"
    got: list[tuple[int, object]] = []

    def waiter() -> Generator[simpy.Event, Any, None]:
        value = yield event
        got.append((env.now, value))

    env.process(waiter())
    env.run()
    assert got == [(0, "done")]
    assert env.next_event_time() is None


def test_a_boundary_event_runs_after_every_event_of_its_timestamp() -> None:
    env = Environment()
    order: list[str] = []
    env.timeout(5).callbacks.append(lambda _: order.append("first"))
    env.run(until=5)

    def at_five(_: object) -> None:
        order.append("boundary")

    env.boundary_event(at_five)
    later = env.event()
    later.callbacks.append(lambda _: order.append("scheduled after, same time"))
    later.succeed()
    env.run()
    assert order == ["first", "scheduled after, same time", "boundary"]
    assert env.now == 5


def test_a_scheduled_event_fires_at_its_time_and_keeps_its_sequence() -> None:
    env = Environment()
    seen: list[int] = []
    event = ScheduledEvent(env, lambda _: seen.append(env.now), 7)
    assert isinstance(event.sequence, int) and event.triggered
    env.run()
    assert seen == [7]
    with pytest.raises(OverflowError):
        ScheduledEvent(env, lambda _: None, 2**63)
