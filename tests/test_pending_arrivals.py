"""Arrivals submitted ahead of time wait outside SimPy's heap, and nothing shows it.

An engine numbers each arrival at ``submit`` but lets it into the heap only once its
earlier arrivals are popped (``simsim.engines.arrivals``). These tests run the same
model twice, once that way and once with every arrival pushed into the heap at
``submit`` (what the engines did before), and require the same steps, clocks, logs with
their sequence numbers, and request tables: with arrivals submitted out of order, from
a process, cancelled before they are due, and next to foreign SimPy events.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import simsim
from simsim.engines.arrivals import PendingArrivals
from simsim.engines.base import EngineBase
from simsim.request import Request

Spec = tuple[int, int, int, int]  # request id, arrival, prompt, output


class _EveryArrivalInHeap(PendingArrivals):
    """The reference: every arrival goes into SimPy's heap at submit."""

    __slots__ = ()

    def add(self, request: Request) -> None:
        self._in_heap = 0  # so that nothing is ever held back
        super().add(request)


def _backend() -> simsim.SimulatedBackend:
    # prefill = 100 + 2 * prompt tokens, decode step = 10 (microseconds)
    config = simsim.SimulatedBackendConfig(
        prefill_base_us=100, prefill_per_token_us=2, decode_base_us=10
    )
    return simsim.SimulatedBackend(config)


ENGINES: dict[str, Callable[[simsim.Environment], EngineBase]] = {
    "single_slot": lambda env: simsim.SimulationEngine(_backend(), env=env),
    "fast": lambda env: simsim.FastSimulationEngine(_backend(), env=env),
    "batching": lambda env: simsim.BatchingEngine(_backend(), max_active_requests=2, env=env),
}


@st.composite
def models(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(0, 12))
    specs = [
        (rid, draw(st.integers(0, 400)), draw(st.integers(0, 30)), draw(st.integers(0, 4)))
        for rid in range(count)
    ]
    shuffled = draw(st.permutations(specs))
    upfront = [spec for spec in shuffled if draw(st.booleans())]
    ids = st.integers(0, max(count - 1, 0))
    return {
        "engine": draw(st.sampled_from(sorted(ENGINES))),
        "upfront": upfront,  # submitted before the run, in this (random) order
        "fed": sorted((s for s in specs if s not in upfront), key=lambda s: s[1]),
        "actions": draw(
            st.lists(
                st.one_of(
                    st.tuples(st.just("step"), st.just(0)),
                    st.tuples(st.just("until"), st.integers(1, 150)),
                    st.tuples(st.just("cancel"), ids),
                ),
                max_size=20,
            )
        ),
        "inside": sorted(draw(st.lists(st.tuples(st.integers(0, 400), ids), max_size=3))),
        "ticks": draw(st.lists(st.integers(0, 200), max_size=4)),
    }


def _drive(model: dict[str, Any], *, reference: bool) -> list[Any]:
    env = simsim.Environment()
    engine = ENGINES[model["engine"]](env)
    if reference:
        engine._arrivals = _EveryArrivalInHeap(env, engine._arrival_callbacks, engine._authorized)
    trace: list[Any] = []

    def attempt(what: str, call: Callable[..., Any], *args: Any) -> None:
        try:
            trace.append((what, call(*args), env.now))
        except (simsim.SimulationError, ValueError) as error:
            trace.append((what, type(error).__name__, str(error)))

    def submit(spec: Spec) -> int:
        return engine.submit(Request(*spec)).request_id

    def feeder() -> Generator[simpy.Event, Any, None]:
        for spec in model["fed"]:
            if spec[1] > env.now:
                yield env.timeout(spec[1] - env.now)
            attempt("submit from a process", submit, spec)

    def canceller() -> Generator[simpy.Event, Any, None]:
        for at, rid in model["inside"]:
            if at > env.now:
                yield env.timeout(at - env.now)
            attempt("cancel from a process", engine.cancel_request, rid)

    def ticker() -> Generator[simpy.Event, Any, None]:
        for delay in model["ticks"]:
            yield env.timeout(delay)
            trace.append(("tick", env.now))

    for spec in model["upfront"]:
        attempt("submit", submit, spec)
    env.process(feeder())
    env.process(canceller())
    env.process(ticker())
    for action, value in model["actions"]:
        if action == "step":
            attempt("step", engine.run_next_timestamp)
            trace.append(("pending", engine.has_pending_events, env.peek()))
        elif action == "until":
            attempt("until", lambda delay: env.run(until=env.now + delay), value)
        else:
            attempt("cancel", engine.cancel_request, value)
    env.run()
    trace.append(
        [(r.timestamp_us, r.sequence, r.event_type, r.request_id) for r in engine.event_log]
    )
    trace.append(list(engine.admission_log))
    trace.append([repr(r) for _, r in sorted(engine.requests.items())])
    trace.append(
        (
            engine.processed_event_count,
            engine.ignored_cancelled_event_count,
            engine.scheduler_stats,
            env.now,
        )
    )
    return trace


@settings(max_examples=examples(300), deadline=None, derandomize=True, database=None)
@given(models())
def test_holding_arrivals_back_changes_nothing(model: dict[str, Any]) -> None:
    assert _drive(model, reference=False) == _drive(model, reference=True)


def test_arrivals_submitted_in_order_keep_the_heap_small() -> None:
    engine = simsim.FastSimulationEngine(_backend())
    for rid in range(1_000):
        engine.submit(simsim.Request(rid, 10 * rid, 4, 2))
    assert len(engine.env._queue) == 1
    assert engine.env.peek() == 0
    engine.run()
    assert all(r.state is simsim.RequestState.FINISHED for r in engine.requests.values())


def test_a_cancelled_arrival_held_back_is_ignored_when_it_is_due() -> None:
    engine = simsim.SimulationEngine(_backend())
    for rid, arrival in enumerate([5, 7, 9]):
        engine.submit(simsim.Request(rid, arrival, 0, 0))
    assert len(engine.env._queue) == 1  # only the arrival at 5
    engine.cancel_request(2)
    times = []
    while (at := engine.run_next_timestamp()) is not None:
        times.append(at)
    assert 9 in times  # it still moves the clock, as it would from the heap
    assert engine.ignored_cancelled_event_count == 1
    arrived = [r.request_id for r in engine.event_log if r.event_type.name == "REQUEST_ARRIVAL"]
    assert arrived == [0, 1]
