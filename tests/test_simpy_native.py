"""SimPy-native use of the engine (contract section 10).

The engine shares a ``simsim.Environment`` with other SimPy processes: clients that submit
and cancel from inside processes, closed-loop clients that ``yield engine.completion(rid)``,
and foreign processes that have nothing to do with the engine. Driving such a model with
``env.run(...)`` must give the same results as calling ``engine.run_next_timestamp()``
until it returns ``None``.

Costs used throughout (microseconds): prefill = 100 + 2 * prompt, decode step = 10.

Sequence reasoning used in the comments: SimPy hands out a sequence number when an event is
*scheduled*. A ``Timeout`` is scheduled when it is created, and a lifecycle event when the
engine schedules it (a request's decode step at T is scheduled while its previous event, at
T - 10, is processed). At equal timestamps the lower sequence runs first; ``Initialize``
(a process start) is URGENT and runs before every NORMAL event at its time; the engine's
admission boundary has priority 2 and runs after every URGENT and NORMAL event at its time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

import pytest
import simpy
from helpers import request_table

import simsim
from simsim import EventType, Request, RequestState

BIG = 10**9

EASY = simsim.SimulatedBackendConfig(
    prefill_base_us=100,
    prefill_per_token_us=2,
    prefill_per_active_sequence_us=0,
    decode_base_us=10,
    decode_per_active_sequence_us=0,
)

ARR = EventType.REQUEST_ARRIVAL
PRE = EventType.PREFILL_COMPLETE
DEC = EventType.DECODE_STEP_COMPLETE
COMP = EventType.REQUEST_COMPLETE

Proc = Generator[simpy.Event, Any, None]


# --------------------------------------------------------------------------- helpers


def make_engine() -> tuple[simsim.Environment, simsim.SimulationEngine]:
    env = simsim.Environment()
    return env, simsim.SimulationEngine(simsim.SimulatedBackend(EASY), env=env)


def events(engine: simsim.SimulationEngine) -> list[tuple[int, EventType, int]]:
    """The event log without sequence numbers."""
    return [(e.timestamp_us, e.event_type, e.request_id) for e in engine.event_log]


def admissions(engine: simsim.SimulationEngine) -> list[tuple[int, int, int]]:
    return [(a.timestamp_us, a.request_id, a.epoch) for a in engine.admission_log]


class Outcome(NamedTuple):
    event_log: list[simsim.EventRecord]
    admission_log: list[simsim.AdmissionRecord]
    table: list[tuple[Any, ...]]
    processed: int
    ignored: int
    stats: simsim.SchedulerStats
    foreign: list[Any]


def outcome(engine: simsim.SimulationEngine, foreign: list[Any]) -> Outcome:
    return Outcome(
        list(engine.event_log),
        list(engine.admission_log),
        request_table(engine),
        engine.processed_event_count,
        engine.ignored_cancelled_event_count,
        engine.scheduler_stats,
        list(foreign),
    )


def without_sequences(result: Outcome) -> Outcome:
    return result._replace(
        event_log=[(e.timestamp_us, e.event_type, e.request_id) for e in result.event_log]
    )


def assert_log_in_timestamp_sequence_order(engine: simsim.SimulationEngine) -> None:
    keys = [(e.timestamp_us, e.sequence) for e in engine.event_log]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)


Scenario = Callable[[], tuple[simsim.Environment, simsim.SimulationEngine, list[Any]]]


def drive_env_run_until(scenario: Scenario) -> Outcome:
    env, engine, foreign = scenario()
    env.run(until=BIG)
    assert not engine.failed
    # SimPy itself leaves its stop event in the heap (rescheduled at BIG with priority -1,
    # no callbacks) when run(until=...) returns, so has_pending_events stays True here.
    assert env.now == BIG
    assert_log_in_timestamp_sequence_order(engine)
    return outcome(engine, foreign)


def drive_env_run(scenario: Scenario) -> Outcome:
    env, engine, foreign = scenario()
    env.run()
    assert not engine.failed
    assert not engine.has_pending_events
    return outcome(engine, foreign)


def step_all(engine: simsim.SimulationEngine) -> list[int]:
    stamps = []
    while (stamp := engine.run_next_timestamp()) is not None:
        stamps.append(stamp)
    return stamps


def drive_stepwise(scenario: Scenario) -> Outcome:
    env, engine, foreign = scenario()
    stamps = step_all(engine)
    assert not engine.failed
    assert not engine.has_pending_events
    # No cost in these scenarios is zero, so no timestamp is returned twice.
    assert stamps == sorted(set(stamps))
    logged = {e.timestamp_us for e in engine.event_log}
    logged |= {a.timestamp_us for a in engine.admission_log}
    assert logged <= set(stamps)
    assert env.now == stamps[-1]
    return outcome(engine, foreign)


DRIVERS = {
    "env_run_until": drive_env_run_until,
    "env_run": drive_env_run,
    "stepwise": drive_stepwise,
}


# --------------------------------------------------------------------------- scenarios


def scenario_open_loop() -> tuple[simsim.Environment, simsim.SimulationEngine, list[Any]]:
    """Two open-loop clients submit from processes, some ahead of time, some for now."""
    env, engine = make_engine()
    foreign: list[Any] = []
    # (submit at, request id, arrival, prompt, output)
    plan = [
        (0, 0, 0, 10, 3),
        (0, 1, 120, 5, 2),  # submitted ahead; arrives as 0's prefill completes
        (30, 3, 30, 0, 0),
        (30, 2, 30, 4, 1),  # same arrival as 3, lower id, submitted second
        (150, 4, 150, 2, 2),  # arrives at the microsecond 0 completes
        (150, 5, 400, 1, 1),
        (260, 6, 260, 0, 3),
        (260, 7, 261, 3, 0),
    ]

    def scripted() -> Proc:
        for submit_at, rid, arrival, prompt, output in plan:
            if submit_at > env.now:
                yield env.timeout(submit_at - env.now)
            engine.submit(Request(rid, arrival, prompt, output))
            foreign.append((env.now, "submit", rid))

    def poisson_like() -> Proc:
        for rid, gap in zip(range(100, 106), (13, 37, 0, 70, 10, 120), strict=True):
            yield env.timeout(gap)
            engine.submit(Request(rid, env.now, rid % 7, rid % 3))
            foreign.append((env.now, "submit", rid))

    env.process(scripted())
    env.process(poisson_like())
    return env, engine, foreign


def scenario_closed_loop() -> tuple[simsim.Environment, simsim.SimulationEngine, list[Any]]:
    """Closed-loop clients: submit, wait for completion, think, resubmit."""
    env, engine = make_engine()
    foreign: list[Any] = []
    ids = itertools.count()

    def client(name: str, prompt: int, output: int, think: int, rounds: int) -> Proc:
        for _ in range(rounds):
            rid = next(ids)
            engine.submit(Request(rid, env.now, prompt, output))
            foreign.append((env.now, name, "submit", rid))
            done = yield engine.completion(rid)
            foreign.append((env.now, name, "done", rid, done.state.name, done.finish_time_us))
            yield env.timeout(think)

    env.process(client("a", 10, 3, 10, 3))  # thinks exactly one decode step
    env.process(client("b", 0, 2, 25, 3))
    env.process(client("c", 5, 0, 0, 2))  # resubmits at the microsecond it finishes
    return env, engine, foreign


def scenario_foreign_ticks() -> tuple[simsim.Environment, simsim.SimulationEngine, list[Any]]:
    """Foreign tickers whose timeouts land on the same microseconds as engine events."""
    env, engine = make_engine()
    foreign: list[Any] = []
    for rid, (arrival, prompt, output) in enumerate(
        [(0, 10, 3), (0, 0, 2), (125, 5, 1), (140, 0, 0)]
    ):
        engine.submit(Request(rid, arrival, prompt, output))

    def ticker(name: str, period: int, last: int) -> Proc:
        while env.now + period <= last:
            yield env.timeout(period)
            states = tuple(
                (r.state.name, r.generated_token_count) for _, r in sorted(engine.requests.items())
            )
            foreign.append(
                (env.now, name, states, len(engine.event_log), len(engine.admission_log))
            )

    env.process(ticker("t10", 10, 500))  # every decode step of every request
    env.process(ticker("t7", 7, 500))
    env.process(ticker("t50", 50, 500))
    return env, engine, foreign


def scenario_cancelling() -> tuple[simsim.Environment, simsim.SimulationEngine, list[Any]]:
    """Clients cancel active, queued and not-yet-arrived requests from inside processes."""
    env, engine = make_engine()
    foreign: list[Any] = []
    specs = [(0, 10, 4), (0, 4, 2), (50, 0, 1), (60, 6, 3), (700, 2, 2), (310, 0, 0)]
    for rid, (arrival, prompt, output) in enumerate(specs):
        engine.submit(Request(rid, arrival, prompt, output))

    def cancel_at(at: int, rid: int) -> Proc:
        yield env.timeout(at)
        request = engine.requests[rid]
        foreign.append((env.now, "cancel", rid, request.state.name, request.generated_token_count))
        if not request.is_terminal:
            engine.cancel_request(rid)

    def cancel_when_done(first: int, then: int) -> Proc:
        yield engine.completion(first)
        foreign.append((env.now, "saw done", first))
        if not engine.requests[then].is_terminal:
            engine.cancel_request(then)

    def impatient(rid: int, at: int, prompt: int, output: int, patience: int) -> Proc:
        yield env.timeout(at)
        engine.submit(Request(rid, env.now, prompt, output))
        result = yield env.any_of([engine.completion(rid), env.timeout(patience)])
        foreign.append((env.now, "impatient", rid, len(result.todict())))
        if not engine.requests[rid].is_terminal:
            engine.cancel_request(rid)

    env.process(cancel_at(140, 0))  # active, decoding, at one of its decode times
    env.process(cancel_at(100, 3))  # queued
    env.process(cancel_at(200, 4))  # not arrived yet
    env.process(cancel_when_done(1, 2))
    env.process(impatient(6, 20, 2, 3, 300))
    env.process(impatient(7, 20, 0, 1, 5000))
    return env, engine, foreign


def scenario_everything() -> tuple[simsim.Environment, simsim.SimulationEngine, list[Any]]:
    """All of the above in one environment, sharing the one engine."""
    env, engine = make_engine()
    foreign: list[Any] = []
    ids = itertools.count(1000)

    def client(name: str, prompt: int, output: int, think: int, rounds: int) -> Proc:
        for _ in range(rounds):
            rid = next(ids)
            engine.submit(Request(rid, env.now, prompt, output))
            done = yield engine.completion(rid)
            foreign.append((env.now, name, rid, done.state.name))
            yield env.timeout(think)

    def open_loop() -> Proc:
        for rid in range(20):
            engine.submit(Request(rid, env.now + 5, (rid * 3) % 11, rid % 4))
            yield env.timeout(17 + (rid % 3) * 3)

    def canceller() -> Proc:
        for at, rid in ((130, 0), (260, 3), (261, 4), (500, 1001), (640, 9)):
            yield env.timeout(at - env.now)
            state = engine.requests[rid].state
            foreign.append((env.now, "cancel", rid, state.name))
            if not engine.requests[rid].is_terminal:
                engine.cancel_request(rid)

    def ticker() -> Proc:
        while env.now < 2000:
            yield env.timeout(10)
            foreign.append((env.now, "tick", len(engine.event_log)))

    env.process(client("a", 4, 2, 10, 4))
    env.process(open_loop())
    env.process(canceller())
    env.process(ticker())
    return env, engine, foreign


SCENARIOS: dict[str, Scenario] = {
    "open_loop": scenario_open_loop,
    "closed_loop": scenario_closed_loop,
    "foreign_ticks": scenario_foreign_ticks,
    "cancelling": scenario_cancelling,
    "everything": scenario_everything,
}


# --------------------------------------------------------------------------- 1. equivalence


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenarios_are_not_trivial(name: str) -> None:
    result = drive_stepwise(SCENARIOS[name])
    assert len(result.event_log) >= 10
    assert len(result.admission_log) >= 2
    assert result.foreign
    states = {row[1] for row in result.table}
    assert RequestState.FINISHED in states
    if name in ("cancelling", "everything"):
        assert RequestState.CANCELLED in states
        assert result.ignored >= 1


@pytest.mark.parametrize("name", SCENARIOS)
def test_env_run_until_equals_stepwise(name: str) -> None:
    """Contract 10: ``env.run(until=...)`` gives the same results as stepping, sequences too.

    Observed in 0.1.0: SimPy's ``run(until=...)`` schedules its stop event through the same
    sequence counter, so every event scheduled during the run gets a sequence one higher
    than under stepping (``env.run()`` without ``until`` matches exactly).
    """
    assert drive_env_run_until(SCENARIOS[name]) == drive_stepwise(SCENARIOS[name])


@pytest.mark.parametrize("name", SCENARIOS)
def test_env_run_until_equals_stepwise_apart_from_sequence_numbers(name: str) -> None:
    by_env = without_sequences(drive_env_run_until(SCENARIOS[name]))
    by_steps = without_sequences(drive_stepwise(SCENARIOS[name]))
    assert by_env == by_steps


@pytest.mark.parametrize("name", SCENARIOS)
def test_env_run_to_exhaustion_equals_stepwise(name: str) -> None:
    assert drive_env_run(SCENARIOS[name]) == drive_stepwise(SCENARIOS[name])


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenarios_are_deterministic(name: str) -> None:
    assert drive_stepwise(SCENARIOS[name]) == drive_stepwise(SCENARIOS[name])


def scenario_hand_worked() -> tuple[simsim.Environment, simsim.SimulationEngine, list[Any]]:
    """Foreign timeouts sharing microseconds with engine events, worked out by hand.

    Request 0 (prompt 10, 3 tokens): admitted at 0, prefill ends 120, tokens at 130, 140,
    150, REQUEST_COMPLETE at 150 (zero delay, scheduled while the token at 150 is
    processed). Request 1 (prompt 0, 1 token) queues at 0, is admitted at the boundary of
    150, prefill ends 250, token and completion at 260.
    """
    env, engine = make_engine()
    seen: list[Any] = []
    engine.submit(Request(0, 0, 10, 3))
    engine.submit(Request(1, 0, 0, 1))

    def look(who: str) -> None:
        r0, r1 = engine.requests[0], engine.requests[1]
        seen.append(
            (
                env.now,
                who,
                r0.state.name,
                r0.generated_token_count,
                r1.state.name,
                len(engine.admission_log),
            )
        )

    def early(who: str, at: int) -> Proc:
        # Timeout created at t=0: its sequence is below that of any decode event.
        yield env.timeout(at)
        look(who)

    def late(who: str, first: int, rest: int) -> Proc:
        # The second timeout is created at `first`, after the decode event at
        # first + rest was scheduled (at first + rest - 10): higher sequence.
        yield env.timeout(first)
        yield env.timeout(rest)
        look(who)

    def waiter() -> Proc:
        yield engine.completion(0)
        look("W")
        yield env.timeout(0)
        look("W+0")
        yield env.timeout(1)
        look("W+1")

    env.process(early("E130", 130))
    env.process(late("L130", 125, 5))
    env.process(early("E150", 150))
    env.process(late("L150", 145, 5))
    env.process(waiter())
    return env, engine, seen


HAND_WORKED_SEEN = [
    # At 130: E130's timeout (sequence from t=0) runs before the decode step at 130
    # (scheduled at 120), which runs before L130's timeout (scheduled at 125).
    (130, "E130", "DECODING", 0, "WAITING", 1),
    (130, "L130", "DECODING", 1, "WAITING", 1),
    # At 150, in sequence order: E150's timeout (t=0); the last decode step (scheduled at
    # 140), which schedules REQUEST_COMPLETE at 150; L150's timeout (scheduled at 145);
    # REQUEST_COMPLETE (scheduled at 150), which succeeds completion(0); the waiter
    # resumes from that event; its timeout(0) runs; only then the boundary admits 1.
    (150, "E150", "DECODING", 2, "WAITING", 1),
    (150, "L150", "DECODING", 3, "WAITING", 1),
    (150, "W", "FINISHED", 3, "WAITING", 1),
    (150, "W+0", "FINISHED", 3, "WAITING", 1),
    (151, "W+1", "FINISHED", 3, "PREFILLING", 2),
]


@pytest.mark.parametrize("driver", DRIVERS)
def test_hand_worked_interleaving_of_foreign_and_engine_events(driver: str) -> None:
    result = DRIVERS[driver](scenario_hand_worked)
    assert result.foreign == HAND_WORKED_SEEN
    assert [(e.timestamp_us, e.event_type, e.request_id) for e in result.event_log] == [
        (0, ARR, 0),
        (0, ARR, 1),
        (120, PRE, 0),
        (130, DEC, 0),
        (140, DEC, 0),
        (150, DEC, 0),
        (150, COMP, 0),
        (250, PRE, 1),
        (260, DEC, 1),
        (260, COMP, 1),
    ]
    # epochs: enqueue 0 -> 1, enqueue 1 -> 2 (both before the boundary at 0), commit -> 3
    assert [(a.timestamp_us, a.request_id, a.epoch) for a in result.admission_log] == [
        (0, 0, 2),
        (150, 1, 3),
    ]
    assert result.table == [
        (0, RequestState.FINISHED, 0, 10, 3, 3, 0, 120, 130, 150),
        (1, RequestState.FINISHED, 0, 0, 1, 1, 150, 250, 260, 260),
    ]
    assert (result.processed, result.ignored) == (10, 0)


def test_hand_worked_stepwise_stops_at_foreign_timestamps() -> None:
    _env, engine, seen = scenario_hand_worked()
    # 125 and 145 (the late processes' first timeouts) and 151 (the waiter) are foreign
    # timestamps; every other one has an engine event.
    assert step_all(engine) == [0, 120, 125, 130, 140, 145, 150, 151, 250, 260]
    assert seen == HAND_WORKED_SEEN


SCENARIOS["hand_worked"] = scenario_hand_worked


# --------------------------------------------------------------------------- 2. cancellation
# Request 0: arrival 0, prompt 10, 5 tokens -> admitted 0, prefill ends 120, tokens at 130,
# 140, 150, 160, 170. Request 5 (prompt 10, 1 token) is submitted before the run to arrive
# at T. At T a process cancels 0 and then submits request 4 (prompt 0, 1 token) to arrive at
# T. If the freed slot were filled at the cancellation, 5 (already queued) would take it;
# filled at the end of T, FCFS ranks (T, 4) before (T, 5), so 4 is admitted at T.
# 4: prefill ends T + 100, token and completion at T + 110; 5 admitted at T + 110, prefill
# ends T + 230, token and completion at T + 240.
# Epochs: enqueue 0 -> 1, commit -> 2, enqueue 5 -> 3, enqueue 4 -> 4 (cancelling an active
# request does not touch the queue), commit -> 5.

CANCEL_CASES = {
    # (T, order): (kind of 0's event at T, request 0 after the run, 0's logged events,
    #              time of the ignored event)
    # Cancel first: the canceller's timeout(T) is created at t=0, below the sequence of
    # 0's prefill (scheduled at the boundary of 0, after the processes started) and of its
    # decode at 140 (scheduled at 130). 0's event at T is the one ignored, at T.
    (120, "cancel_first"): (
        (0, RequestState.CANCELLED, 0, 10, 5, 0, 0, None, None, 120),
        [(0, ARR, 0)],
        120,
    ),
    (140, "cancel_first"): (
        (0, RequestState.CANCELLED, 0, 10, 5, 1, 0, 120, 130, 140),
        [(0, ARR, 0), (120, PRE, 0), (130, DEC, 0)],
        140,
    ),
    # Event first: the canceller waits T - 5 then 5; its second timeout is created at
    # T - 5, after 0's event at T was scheduled (at 0 for the prefill, at 130 for the
    # decode). What that event did stands; the event it scheduled (at T + 10) is ignored.
    (120, "event_first"): (
        (0, RequestState.CANCELLED, 0, 10, 5, 0, 0, 120, None, 120),
        [(0, ARR, 0), (120, PRE, 0)],
        130,
    ),
    (140, "event_first"): (
        (0, RequestState.CANCELLED, 0, 10, 5, 2, 0, 120, 130, 140),
        [(0, ARR, 0), (120, PRE, 0), (130, DEC, 0), (140, DEC, 0)],
        150,
    ),
}


def build_cancel_case(
    at: int, order: str
) -> tuple[simsim.Environment, simsim.SimulationEngine, list[Any]]:
    env, engine = make_engine()
    seen: list[Any] = []

    def canceller() -> Proc:
        if order == "cancel_first":
            yield env.timeout(at)
        else:
            yield env.timeout(at - 5)
            yield env.timeout(5)
        r0, r5 = engine.requests[0], engine.requests[5]
        seen.append((env.now, r0.state.name, r0.generated_token_count, r5.state.name))
        engine.cancel_request(0)
        # Not refilled in the middle of T: 5 is queued but not admitted.
        seen.append((env.now, r0.state.name, r0.finish_time_us, r5.state.name))
        engine.submit(Request(4, env.now, 0, 1))
        seen.append((env.now, len(engine.admission_log)))

    env.process(canceller())
    engine.submit(Request(0, 0, 10, 5))
    engine.submit(Request(5, at, 10, 1))
    return env, engine, seen


@pytest.mark.parametrize("driver", ["env_run_until", "stepwise"])
@pytest.mark.parametrize(("at", "order"), CANCEL_CASES)
def test_cancellation_inside_simulation_at_a_lifecycle_timestamp(
    at: int, order: str, driver: str
) -> None:
    row0, log0, ignored_at = CANCEL_CASES[at, order]
    env, engine, seen = build_cancel_case(at, order)
    if driver == "env_run_until":
        env.run(until=BIG)
    else:
        stamps = step_all(engine)
        assert ignored_at in stamps  # an ignored event still moves the clock
    assert not engine.failed

    before_state = {120: "PREFILLING", 140: "DECODING"}[at]
    if order == "event_first":
        before_state = "DECODING"
    assert seen == [
        (at, before_state, row0[5], "WAITING"),
        (at, "CANCELLED", at, "WAITING"),
        (at, 1),
    ]
    assert request_table(engine) == [
        row0,
        (4, RequestState.FINISHED, at, 0, 1, 1, at, at + 100, at + 110, at + 110),
        (5, RequestState.FINISHED, at, 10, 1, 1, at + 110, at + 230, at + 240, at + 240),
    ]
    assert admissions(engine) == [(0, 0, 1), (at, 4, 4), (at + 110, 5, 5)]
    arrivals_at_t = [(at, ARR, 5)]
    if order == "event_first":
        # 5's arrival was scheduled at submission, before 0's event at T.
        arrivals_at_t.append(log0[-1])
        log0 = log0[:-1]
    assert events(engine) == [
        *log0,
        *arrivals_at_t,
        (at, ARR, 4),
        (at + 100, PRE, 4),
        (at + 110, DEC, 4),
        (at + 110, COMP, 4),
        (at + 230, PRE, 5),
        (at + 240, DEC, 5),
        (at + 240, COMP, 5),
    ]
    assert engine.ignored_cancelled_event_count == 1
    assert engine.processed_event_count == len(engine.event_log) + 1
    assert_log_in_timestamp_sequence_order(engine)


def test_cancel_first_ignores_the_event_at_the_same_timestamp_and_logs_nothing_for_it() -> None:
    _env, engine, _ = build_cancel_case(140, "cancel_first")
    engine.run_next_timestamp()  # 0
    engine.run_next_timestamp()  # 120
    engine.run_next_timestamp()  # 130
    assert engine.ignored_cancelled_event_count == 0
    assert engine.run_next_timestamp() == 140
    # the cancellation ran before 0's decode at 140, which was consumed silently at 140
    assert engine.ignored_cancelled_event_count == 1
    assert engine.requests[0].generated_token_count == 1
    assert [e for e in events(engine) if e[0] == 140] == [(140, ARR, 5), (140, ARR, 4)]
    assert admissions(engine)[-1] == (140, 4, 4)
    assert engine.requests[4].state is RequestState.PREFILLING


def test_event_first_keeps_the_token_and_ignores_the_next_event() -> None:
    _env, engine, _ = build_cancel_case(140, "event_first")
    assert [engine.run_next_timestamp() for _ in range(5)] == [0, 120, 130, 135, 140]
    assert engine.ignored_cancelled_event_count == 0
    assert engine.requests[0].generated_token_count == 2
    assert [e for e in events(engine) if e[0] == 140] == [
        (140, ARR, 5),
        (140, DEC, 0),
        (140, ARR, 4),
    ]
    assert admissions(engine)[-1] == (140, 4, 4)
    assert engine.run_next_timestamp() == 150  # 0's next decode step, ignored
    assert engine.ignored_cancelled_event_count == 1
    assert [e for e in events(engine) if e[0] == 150] == []


def test_cancelling_a_queued_request_inside_the_simulation_frees_nothing_and_logs_nothing() -> None:
    env, engine = make_engine()
    engine.submit(Request(0, 0, 10, 2))  # admitted 0, prefill 120, tokens 130, 140
    engine.submit(Request(1, 0, 0, 0))  # queued
    engine.submit(Request(2, 0, 0, 0))  # queued

    def canceller() -> Proc:
        yield env.timeout(125)
        engine.cancel_request(1)

    env.process(canceller())
    env.run(until=BIG)
    assert request_table(engine) == [
        (0, RequestState.FINISHED, 0, 10, 2, 2, 0, 120, 130, 140),
        (1, RequestState.CANCELLED, 0, 0, 0, 0, None, None, None, 125),
        (2, RequestState.FINISHED, 0, 0, 0, 0, 140, 240, None, 240),
    ]
    # epochs: 3 enqueues -> 3; commit -> 4; remove -> 5; commit -> 6
    assert admissions(engine) == [(0, 0, 3), (140, 2, 5)]
    assert engine.ignored_cancelled_event_count == 0
    assert engine.scheduler_stats.removed == 1


# --------------------------------------------------------------------------- 3. completion


def test_completion_succeeds_with_the_request_when_it_finishes() -> None:
    env, engine = make_engine()
    request = engine.submit(Request(0, 0, 10, 3))  # finishes at 150
    got: list[Any] = []

    def waiter() -> Proc:
        value = yield engine.completion(0)
        got.append((env.now, value, value.state))

    env.process(waiter())
    env.run(until=BIG)
    assert got == [(150, request, RequestState.FINISHED)]
    assert got[0][1] is request
    event = engine.completion(0)
    assert event.processed and event.ok
    assert event.value is request


def test_completion_succeeds_with_the_request_when_it_is_cancelled() -> None:
    env, engine = make_engine()
    active = engine.submit(Request(0, 0, 10, 3))  # decoding at 135
    queued = engine.submit(Request(1, 0, 5, 1))  # queued at 135
    future = engine.submit(Request(2, 500, 5, 1))  # not arrived at 135
    got: list[Any] = []

    def waiter(rid: int) -> Proc:
        value = yield engine.completion(rid)
        got.append((env.now, value.request_id, value.state, value.finish_time_us))
        assert value is engine.requests[rid]

    def canceller() -> Proc:
        yield env.timeout(135)
        engine.cancel_request(2)
        engine.cancel_request(0)
        engine.cancel_request(1)

    for rid in (0, 1, 2):
        env.process(waiter(rid))
    env.process(canceller())
    env.run(until=BIG)
    # completion events succeed in cancellation order and the waiters resume at 135
    assert got == [
        (135, 2, RequestState.CANCELLED, 135),
        (135, 0, RequestState.CANCELLED, 135),
        (135, 1, RequestState.CANCELLED, 135),
    ]
    assert active.generated_token_count == 1
    assert queued.admit_time_us is None
    assert future.state is RequestState.CANCELLED
    # 0's decode at 140 and 2's arrival at 500 are ignored
    assert engine.ignored_cancelled_event_count == 2
    for rid in (0, 1, 2):
        assert engine.completion(rid).value is engine.requests[rid]


def test_completion_fires_for_a_cancellation_made_between_timestamps() -> None:
    env, engine = make_engine()
    request = engine.submit(Request(0, 0, 10, 3))
    got: list[Any] = []

    def waiter() -> Proc:
        value = yield engine.completion(0)
        got.append((env.now, value))

    env.process(waiter())
    while engine.run_next_timestamp() != 130:
        pass
    event = engine.completion(0)
    assert not event.triggered
    engine.cancel_request(0)
    assert event.triggered and event.value is request
    engine.run()
    assert got == [(130, request)]
    assert request.state is RequestState.CANCELLED
    assert request.finish_time_us == 130


def test_completion_of_a_terminal_request_is_already_processed_and_resumes_at_once() -> None:
    env, engine = make_engine()
    finished = engine.submit(Request(0, 0, 10, 3))  # finishes at 150
    cancelled = engine.submit(Request(1, 400, 1, 1))  # cancelled at 200
    got: list[Any] = []

    def canceller() -> Proc:
        yield env.timeout(200)
        engine.cancel_request(1)

    def late(rid: int) -> Proc:
        yield env.timeout(300)
        event = engine.completion(rid)
        assert event.triggered and event.processed and event.ok
        before = env.now
        value = yield event
        got.append((before, env.now, value))
        value = yield event  # a processed event can be yielded again
        got.append((before, env.now, value))

    env.process(canceller())
    env.process(late(0))
    env.process(late(1))
    env.run()
    assert got == [
        (300, 300, finished),
        (300, 300, finished),
        (300, 300, cancelled),
        (300, 300, cancelled),
    ]
    assert got[0][2] is finished and got[2][2] is cancelled
    # asking after the run schedules nothing
    assert not engine.has_pending_events
    event = engine.completion(0)
    assert event.processed and event.value is finished
    assert not engine.has_pending_events


def test_completion_returns_the_same_event_every_time() -> None:
    env, engine = make_engine()
    engine.submit(Request(0, 0, 10, 3))
    engine.submit(Request(1, 0, 0, 0))
    first = engine.completion(0)
    assert engine.completion(0) is first
    assert not first.triggered
    env.run(until=BIG)
    assert engine.completion(0) is first
    assert first.processed and first.value is engine.requests[0]
    # asked for the first time after it became terminal: born processed, then cached
    late = engine.completion(1)
    assert late.processed
    assert engine.completion(1) is late


def test_completion_of_an_unknown_request_raises_unknown_request_error() -> None:
    env, engine = make_engine()
    engine.submit(Request(0, 0, 1, 1))
    _other_env, other = make_engine()
    other.submit(Request(7, 0, 1, 1))
    with pytest.raises(simsim.UnknownRequestError) as info:
        engine.completion(7)
    assert isinstance(info.value, KeyError)
    assert isinstance(info.value, simsim.SimulationError)
    caught: list[Any] = []

    def asker() -> Proc:
        yield env.timeout(5)
        try:
            engine.completion(99)
        except simsim.UnknownRequestError as error:
            caught.append((env.now, type(error)))

    env.process(asker())
    env.run(until=BIG)
    assert caught == [(5, simsim.UnknownRequestError)]
    assert not engine.failed
    assert engine.requests[0].state is RequestState.FINISHED


# --------------------------------------------------------------------------- 4. deadline race
# Request 0: prompt 10, 3 tokens: admitted 0, prefill ends 120, tokens at 130, 140 and 150,
# REQUEST_COMPLETE at 150 (scheduled with zero delay while the token at 150 is processed).


def build_deadline_client(
    deadline: int, *, any_of: bool = True, wait_first: int = 0
) -> tuple[simsim.Environment, simsim.SimulationEngine, list[Any]]:
    env, engine = make_engine()
    seen: list[Any] = []

    def client() -> Proc:
        engine.submit(Request(0, 0, 10, 3))
        if wait_first:
            yield env.timeout(wait_first)
        done = engine.completion(0)
        deadline_timeout = env.timeout(deadline - env.now)
        if any_of:
            result = yield env.any_of([done, deadline_timeout])
            pairs = (("completion", done), ("timeout", deadline_timeout))
            winners = tuple(name for name, event in pairs if event in result)
        else:
            yield deadline_timeout
            winners = ("timeout",)
        request = engine.requests[0]
        seen.append((env.now, winners, request.state.name, request.generated_token_count))
        if not engine.requests[0].is_terminal:
            engine.cancel_request(0)

    env.process(client())
    return env, engine, seen


RACE_CASES = {
    # Deadline and completion at the same microsecond, deadline timeout created at t=0.
    # At 150, in sequence order: the deadline timeout (created at 0) succeeds the any_of
    # condition, which is scheduled at 150 with a fresh sequence; the last decode step
    # (scheduled at 140, so below the condition) generates token 3 and schedules
    # REQUEST_COMPLETE (above the condition); the condition resumes the client, which finds
    # the request DECODING with all 3 tokens and cancels it; REQUEST_COMPLETE is ignored.
    "same_microsecond": (
        {"deadline": 150},
        [(150, ("timeout",), "DECODING", 3)],
        (0, RequestState.CANCELLED, 0, 10, 3, 3, 0, 120, 130, 150),
        [(0, ARR, 0), (120, PRE, 0), (130, DEC, 0), (140, DEC, 0), (150, DEC, 0)],
        1,
    ),
    # One microsecond later the completion wins, and the client resumes at 150.
    "deadline_after": (
        {"deadline": 151},
        [(150, ("completion",), "FINISHED", 3)],
        (0, RequestState.FINISHED, 0, 10, 3, 3, 0, 120, 130, 150),
        [(0, ARR, 0), (120, PRE, 0), (130, DEC, 0), (140, DEC, 0), (150, DEC, 0), (150, COMP, 0)],
        0,
    ),
    # One microsecond earlier: cancelled with 2 tokens, the decode step at 150 is ignored.
    "deadline_before": (
        {"deadline": 149},
        [(149, ("timeout",), "DECODING", 2)],
        (0, RequestState.CANCELLED, 0, 10, 3, 2, 0, 120, 130, 149),
        [(0, ARR, 0), (120, PRE, 0), (130, DEC, 0), (140, DEC, 0)],
        1,
    ),
    # Yielding the bare timeout (no any_of) resumes the client inside the timeout's own
    # processing, before the last decode step at 150: cancelled with 2 tokens at 150.
    "bare_timeout": (
        {"deadline": 150, "any_of": False},
        [(150, ("timeout",), "DECODING", 2)],
        (0, RequestState.CANCELLED, 0, 10, 3, 2, 0, 120, 130, 150),
        [(0, ARR, 0), (120, PRE, 0), (130, DEC, 0), (140, DEC, 0)],
        1,
    ),
    # The deadline timeout created at 145, after the last decode step was scheduled (at
    # 140) but before REQUEST_COMPLETE (scheduled at 150). At 150: decode step; the timeout
    # schedules the condition; REQUEST_COMPLETE finishes the request and succeeds the
    # completion event (scheduled after the condition, so not yet processed); the client
    # resumes with only the timeout in the result but finds the request FINISHED: the
    # is_terminal guard is what keeps it from an InvalidTransitionError.
    "deadline_created_late": (
        {"deadline": 150, "wait_first": 145},
        [(150, ("timeout",), "FINISHED", 3)],
        (0, RequestState.FINISHED, 0, 10, 3, 3, 0, 120, 130, 150),
        [(0, ARR, 0), (120, PRE, 0), (130, DEC, 0), (140, DEC, 0), (150, DEC, 0), (150, COMP, 0)],
        0,
    ),
}


@pytest.mark.parametrize("driver", ["env_run_until", "stepwise"])
@pytest.mark.parametrize("case", RACE_CASES)
def test_deadline_and_completion_race(case: str, driver: str) -> None:
    kwargs, expected_seen, row, log, ignored = RACE_CASES[case]
    env, engine, seen = build_deadline_client(**kwargs)
    if driver == "env_run_until":
        env.run(until=BIG)
    else:
        step_all(engine)
    assert not engine.failed
    assert seen == expected_seen
    assert request_table(engine) == [row]
    assert events(engine) == log
    assert engine.ignored_cancelled_event_count == ignored
    assert engine.processed_event_count == len(log) + ignored
    completion = engine.completion(0)
    assert completion.processed
    assert completion.value is engine.requests[0]
    assert_log_in_timestamp_sequence_order(engine)


def test_same_microsecond_race_step_by_step() -> None:
    _env, engine, seen = build_deadline_client(150)
    assert [engine.run_next_timestamp() for _ in range(4)] == [0, 120, 130, 140]
    request = engine.requests[0]
    assert (request.state, request.generated_token_count) == (RequestState.DECODING, 2)
    assert seen == []
    assert engine.run_next_timestamp() == 150
    # everything at 150 happened in one call: token 3, the client's cancellation and the
    # ignored REQUEST_COMPLETE
    assert seen == [(150, ("timeout",), "DECODING", 3)]
    assert (request.state, request.generated_token_count) == (RequestState.CANCELLED, 3)
    assert request.finish_time_us == 150
    assert engine.ignored_cancelled_event_count == 1
    assert engine.run_next_timestamp() is None


# --------------------------------------------------------------------------- 5. misuse
# Request 0: prompt 10, 2 tokens: admitted 0, prefill ends 120, tokens at 130 and 140,
# finished at 140. Request 1 (prompt 0, 1 token) queued at 0, admitted at 140, prefill ends
# 240, token and completion at 250. Request 2 (arrival 1000) is cancelled at 150 before it
# arrives; its arrival at 1000 is ignored.


def test_plain_simpy_environment_is_refused() -> None:
    with pytest.raises(TypeError):
        simsim.SimulationEngine(simsim.SimulatedBackend(EASY), env=simpy.Environment())
    plain = simpy.Environment()
    caught: list[Any] = []

    def builder() -> Generator[simpy.Event, Any, None]:
        yield plain.timeout(1)
        try:
            simsim.SimulationEngine(simsim.SimulatedBackend(EASY), env=plain)  # type: ignore[arg-type]
        except TypeError as error:
            caught.append((plain.now, type(error)))

    plain.process(builder())
    plain.run()
    assert caught == [(1, TypeError)]


def build_misuse(
    misbehave: bool,
) -> tuple[simsim.Environment, simsim.SimulationEngine, list[Any]]:
    env, engine = make_engine()
    seen: list[Any] = []
    engine.submit(Request(0, 0, 10, 2))
    engine.submit(Request(1, 0, 0, 1))
    engine.submit(Request(2, 1000, 3, 1))

    def attempt(what: str, call: Callable[[], object]) -> None:
        before = outcome(engine, [])
        try:
            call()
        except Exception as error:
            seen.append((env.now, what, type(error)))
        else:
            seen.append((env.now, what, None))
        assert not engine.failed
        assert outcome(engine, []) == before

    def meddler() -> Proc:
        yield env.timeout(135)  # 0 is decoding with 1 token, 1 is queued
        if misbehave:
            attempt("cancel unknown", lambda: engine.cancel_request(99))
            attempt("submit in the past", lambda: engine.submit(Request(3, 134, 1, 1)))
            attempt("submit duplicate id", lambda: engine.submit(Request(1, 200, 1, 1)))
            attempt("float timeout", lambda: env.timeout(1.5))
            attempt("negative timeout", lambda: env.timeout(-1))
        yield env.timeout(15)  # 150: 0 finished at 140, 1 admitted at 140
        engine.cancel_request(2)
        if misbehave:
            attempt("cancel finished", lambda: engine.cancel_request(0))
            attempt("cancel cancelled", lambda: engine.cancel_request(2))
            attempt("submit in the past", lambda: engine.submit(Request(3, 149, 1, 1)))
        yield env.timeout(50)
        seen.append((env.now, "done"))

    env.process(meddler())
    return env, engine, seen


def test_misuse_inside_a_process_changes_nothing_and_the_run_completes() -> None:
    env, engine, seen = build_misuse(misbehave=True)
    env.run(until=BIG)
    assert seen == [
        (135, "cancel unknown", simsim.UnknownRequestError),
        (135, "submit in the past", ValueError),
        (135, "submit duplicate id", ValueError),
        (135, "float timeout", TypeError),
        (135, "negative timeout", ValueError),
        (150, "cancel finished", simsim.InvalidTransitionError),
        (150, "cancel cancelled", simsim.InvalidTransitionError),
        (150, "submit in the past", ValueError),
        (200, "done"),
    ]
    assert not engine.failed
    assert request_table(engine) == [
        (0, RequestState.FINISHED, 0, 10, 2, 2, 0, 120, 130, 140),
        (1, RequestState.FINISHED, 0, 0, 1, 1, 140, 240, 250, 250),
        (2, RequestState.CANCELLED, 1000, 3, 1, 0, None, None, None, 150),
    ]
    assert admissions(engine) == [(0, 0, 2), (140, 1, 3)]
    assert engine.ignored_cancelled_event_count == 1
    # the refused calls scheduled nothing: the run is identical, sequence numbers included,
    # to the same model without them
    reference_env, reference, reference_seen = build_misuse(misbehave=False)
    reference_env.run(until=BIG)
    assert reference_seen == [(200, "done")]
    assert outcome(engine, []) == outcome(reference, [])


def build_crashing(crash: bool) -> tuple[simsim.Environment, simsim.SimulationEngine]:
    env, engine = make_engine()
    engine.submit(Request(0, 0, 10, 2))
    engine.submit(Request(1, 0, 0, 1))

    def fragile() -> Proc:
        yield env.timeout(135)
        if crash:
            env.timeout(1.5)  # TypeError: the process fails

    env.process(fragile())
    return env, engine


def test_float_timeout_fails_the_process_not_the_engine() -> None:
    env, engine = build_crashing(crash=True)
    reference_env, reference = build_crashing(crash=False)
    with pytest.raises(TypeError):
        env.run()
    assert env.now == 135
    assert not engine.failed
    reference_env.run(until=135)
    assert reference_env.now == 135
    at_crash = outcome(engine, [])
    assert without_sequences(at_crash) == without_sequences(outcome(reference, []))
    assert at_crash.table[0][1] is RequestState.DECODING
    # the simulation continues to completion with the engine's results unaffected
    env.run()
    assert not engine.failed
    assert not engine.has_pending_events
    assert request_table(engine) == [
        (0, RequestState.FINISHED, 0, 10, 2, 2, 0, 120, 130, 140),
        (1, RequestState.FINISHED, 0, 0, 1, 1, 140, 240, 250, 250),
    ]
    fresh_env, fresh = build_crashing(crash=False)
    fresh_env.run()
    assert outcome(engine, []) == outcome(fresh, [])


def test_float_timeout_inside_a_process_under_env_run_until_raises_type_error() -> None:
    env, engine = build_crashing(crash=True)
    with pytest.raises(TypeError):
        env.run(until=BIG)
    assert not engine.failed
    env.run(until=BIG)
    assert [row[1] for row in request_table(engine)] == [RequestState.FINISHED] * 2


def test_failing_foreign_process_propagates_out_of_run_next_timestamp() -> None:
    env, engine = build_crashing(crash=True)
    with pytest.raises(TypeError):
        step_all(engine)
    assert env.now == 135
    assert not engine.failed
    step_all(engine)
    assert [row[1] for row in request_table(engine)] == [RequestState.FINISHED] * 2


# --------------------------------------------------------------------------- 6. endless model


def test_never_ending_process_driven_with_env_run_until() -> None:
    env, engine = make_engine()
    ticks: list[Any] = []
    engine.submit(Request(0, 0, 10, 3))  # admitted 0, prefill 120, tokens 130-150
    engine.submit(Request(1, 0, 0, 2))  # admitted 150, prefill 250, tokens 260, 270

    def ticker() -> Proc:
        while True:
            yield env.timeout(1000)
            ticks.append((env.now, tuple(r.state.name for _, r in sorted(engine.requests.items()))))

    def late_client() -> Proc:
        yield env.timeout(5000)
        # the engine has been idle since 270; admitted at once at 5000, prefill 140
        engine.submit(Request(2, 5000, 20, 1))
        done = yield engine.completion(2)
        ticks.append((env.now, "late done", done.state.name))

    env.process(ticker())
    env.process(late_client())
    env.run(until=10_000)
    assert env.now == 10_000
    assert not engine.failed
    assert engine.has_pending_events
    expected_table = [
        (0, RequestState.FINISHED, 0, 10, 3, 3, 0, 120, 130, 150),
        (1, RequestState.FINISHED, 0, 0, 2, 2, 150, 250, 260, 270),
        (2, RequestState.FINISHED, 5000, 20, 1, 1, 5000, 5140, 5150, 5150),
    ]
    assert request_table(engine) == expected_table
    # epochs: two enqueues -> 2, commit -> 3, commit -> 4, enqueue -> 5
    assert admissions(engine) == [(0, 0, 2), (150, 1, 3), (5000, 2, 5)]
    expected_log = [
        (0, ARR, 0),
        (0, ARR, 1),
        (120, PRE, 0),
        (130, DEC, 0),
        (140, DEC, 0),
        (150, DEC, 0),
        (150, COMP, 0),
        (250, PRE, 1),
        (260, DEC, 1),
        (270, DEC, 1),
        (270, COMP, 1),
        (5000, ARR, 2),
        (5140, PRE, 2),
        (5150, DEC, 2),
        (5150, COMP, 2),
    ]
    assert events(engine) == expected_log
    all_finished = ("FINISHED",) * 3
    assert ticks == [
        *[(t, ("FINISHED", "FINISHED")) for t in range(1000, 5000, 1000)],
        (5000, ("FINISHED", "FINISHED", "WAITING")),  # the tick at 5000 was scheduled first
        (5150, "late done", "FINISHED"),
        *[(t, all_finished) for t in range(6000, 10_000, 1000)],
    ]
    # the stop event at 10_000 is URGENT and ran before the tick at 10_000, still pending
    assert engine.run_next_timestamp() == 10_000
    assert ticks[-1] == (10_000, all_finished)
    env.run(until=20_000)
    assert engine.has_pending_events
    assert ticks[-1] == (19_000, all_finished)
    assert request_table(engine) == expected_table
    assert events(engine) == expected_log
    assert engine.processed_event_count == len(expected_log)
