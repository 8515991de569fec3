"""Contract sections 1-2: integer-microsecond time and ``simsim.Environment``.

Black-box tests against ``import simsim`` only. Every expected time is worked out by hand in
the comments next to it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
import simpy
from simpy.events import NORMAL, URGENT

import simsim

MAX_US = 2**63 - 1

NON_INT_TIMES: list[Any] = [1.5, 2.0, True, False, Decimal(3), "4"]


def _recorder(log: list[str], tag: str) -> Callable[[simpy.Event], None]:
    def callback(_event: simpy.Event) -> None:
        log.append(tag)

    return callback


# --------------------------------------------------------------------------- construction


def test_environment_is_a_simpy_environment() -> None:
    env = simsim.Environment()
    assert isinstance(env, simpy.Environment)


def test_clock_starts_at_zero_and_is_a_plain_int() -> None:
    env = simsim.Environment()
    assert env.now == 0
    assert type(env.now) is int


def test_initial_time_is_honoured() -> None:
    env = simsim.Environment(initial_time=1_000)
    assert env.now == 1_000
    assert type(env.now) is int


def test_initial_time_numpy_int_is_accepted_and_reported_as_plain_int() -> None:
    env = simsim.Environment(initial_time=np.int64(250))
    assert env.now == 250
    assert type(env.now) is int


@pytest.mark.parametrize("bad", [1.0, 0.5, True, False, Decimal(1), "0"])
def test_initial_time_must_be_an_int(bad: Any) -> None:
    with pytest.raises(TypeError):
        simsim.Environment(initial_time=bad)


def test_initial_time_must_be_non_negative() -> None:
    with pytest.raises(ValueError):
        simsim.Environment(initial_time=-1)


def test_initial_time_past_64_bits_is_rejected() -> None:
    with pytest.raises((OverflowError, ValueError)):
        simsim.Environment(initial_time=MAX_US + 1)


# --------------------------------------------------------------------------- timeout


def test_timeout_moves_the_clock_by_exactly_the_delay() -> None:
    env = simsim.Environment()
    seen: list[int] = []

    def proc() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(7)  # 0 + 7 = 7
        seen.append(env.now)
        yield env.timeout(0)  # zero delay: still 7
        seen.append(env.now)
        yield env.timeout(993)  # 7 + 993 = 1000
        seen.append(env.now)

    env.process(proc())
    env.run()
    assert seen == [7, 7, 1_000]
    assert all(type(t) is int for t in seen)
    assert env.now == 1_000
    assert type(env.now) is int


def test_timeout_with_numpy_delay_is_accepted_and_now_stays_plain_int() -> None:
    env = simsim.Environment()
    for dtype in (np.int8, np.int32, np.int64, np.uint16):
        env.timeout(dtype(5))
    assert env.peek() == 5
    assert type(env.peek()) is int
    env.run()
    # all four timeouts fire at 0 + 5 = 5
    assert env.now == 5
    assert type(env.now) is int


@pytest.mark.parametrize("bad", NON_INT_TIMES)
def test_timeout_rejects_non_int_delay_with_type_error(bad: Any) -> None:
    env = simsim.Environment()
    with pytest.raises(TypeError):
        env.timeout(bad)
    assert env.now == 0


def test_timeout_rejects_numpy_float_delay() -> None:
    env = simsim.Environment()
    with pytest.raises(TypeError):
        env.timeout(np.float64(5.0))


def test_timeout_rejects_negative_delay_with_value_error() -> None:
    env = simsim.Environment()
    with pytest.raises(ValueError):
        env.timeout(-1)


def test_timeout_up_to_the_64_bit_limit_is_fine() -> None:
    env = simsim.Environment()
    env.timeout(MAX_US)  # 0 + (2**63 - 1) is exactly the largest legal time
    env.run()
    assert env.now == MAX_US
    assert type(env.now) is int


def test_timeout_whose_target_time_overflows_raises_overflow_error() -> None:
    env = simsim.Environment(initial_time=10)
    # the delay itself is a legal 64-bit value, but 10 + (2**63 - 5) = 2**63 + 5 is not
    with pytest.raises(OverflowError):
        env.timeout(MAX_US - 4)
    with pytest.raises(OverflowError):
        env.timeout(MAX_US - 9)  # 10 + 2**63 - 10 = 2**63: one past the limit


def test_timeout_landing_exactly_on_the_limit_from_a_nonzero_clock_is_fine() -> None:
    env = simsim.Environment(initial_time=10)
    env.timeout(MAX_US - 10)  # 10 + 2**63 - 11 = 2**63 - 1
    env.run()
    assert env.now == MAX_US


def test_timeout_with_delay_past_64_bits_is_rejected() -> None:
    env = simsim.Environment()
    with pytest.raises((OverflowError, ValueError)):
        env.timeout(MAX_US + 1)
    with pytest.raises((OverflowError, ValueError)):
        env.timeout(2**80)


def test_timeout_value_is_preserved() -> None:
    env = simsim.Environment()
    got: list[Any] = []

    def proc() -> Generator[simpy.Event, Any, None]:
        value = yield env.timeout(3, value="payload")
        got.append((env.now, value))

    env.process(proc())
    env.run()
    assert got == [(3, "payload")]


# --------------------------------------------------------------------------- other paths


@pytest.mark.parametrize("bad", NON_INT_TIMES)
def test_schedule_rejects_non_int_delay(bad: Any) -> None:
    env = simsim.Environment()
    with pytest.raises(TypeError):
        env.schedule(env.event(), NORMAL, bad)


def test_schedule_rejects_negative_delay() -> None:
    env = simsim.Environment()
    with pytest.raises(ValueError):
        env.schedule(env.event(), NORMAL, -3)


def test_schedule_rejects_overflowing_time() -> None:
    env = simsim.Environment(initial_time=1)
    with pytest.raises(OverflowError):
        env.schedule(env.event(), NORMAL, MAX_US)  # 1 + 2**63 - 1 = 2**63


def test_timeout_class_constructed_directly_is_checked_too() -> None:
    env = simsim.Environment()
    with pytest.raises(TypeError):
        simpy.Timeout(env, 2.5)
    with pytest.raises(ValueError):
        simpy.Timeout(env, -2)


def test_event_succeed_schedules_at_now() -> None:
    env = simsim.Environment(initial_time=42)
    log: list[int] = []
    ev = env.event()
    ev.callbacks.append(lambda _e: log.append(env.now))
    ev.succeed()
    env.run()
    assert log == [42]
    assert type(log[0]) is int


# --------------------------------------------------------------------------- run(until=...)


@pytest.mark.parametrize("bad", [10.0, 10.5, True, np.float64(10.0)])
def test_run_until_rejects_float_and_bool(bad: Any) -> None:
    env = simsim.Environment()
    env.timeout(3)
    with pytest.raises(TypeError):
        env.run(until=bad)
    assert env.now == 0


@pytest.mark.parametrize("bad", [Decimal(10), "10"])
def test_run_until_rejects_other_non_int_times(bad: Any) -> None:
    env = simsim.Environment()
    with pytest.raises(TypeError):
        env.run(until=bad)
    assert env.now == 0


def test_run_until_past_64_bits_is_rejected() -> None:
    env = simsim.Environment()
    with pytest.raises((OverflowError, ValueError)):
        env.run(until=MAX_US + 1)


def test_run_until_negative_time_is_rejected() -> None:
    env = simsim.Environment()
    with pytest.raises(ValueError):
        env.run(until=-1)
    assert env.now == 0


def test_numpy_delay_past_64_bits_is_rejected() -> None:
    env = simsim.Environment()
    with pytest.raises((OverflowError, ValueError)):
        env.timeout(np.uint64(2**63))


def test_run_until_int_stops_at_that_time() -> None:
    env = simsim.Environment()
    fired: list[int] = []
    for delay in (5, 10, 15):
        env.timeout(delay).callbacks.append(lambda _e: fired.append(env.now))
    env.run(until=10)
    # run(until=10) stops *before* events at 10 (SimPy semantics): only the one at 5 fired
    assert fired == [5]
    assert env.now == 10
    assert type(env.now) is int
    env.run()
    assert fired == [5, 10, 15]
    assert env.now == 15


def test_run_until_numpy_int_is_accepted() -> None:
    env = simsim.Environment()
    env.run(until=np.int64(77))
    assert env.now == 77
    assert type(env.now) is int


def test_run_until_an_event_still_works() -> None:
    env = simsim.Environment()
    target = env.timeout(12, value="done")
    env.timeout(50)
    assert env.run(until=target) == "done"
    assert env.now == 12


def test_clock_never_moves_backwards() -> None:
    env = simsim.Environment()
    env.run(until=100)
    with pytest.raises(ValueError):
        env.run(until=50)
    assert env.now == 100


def test_huge_simulated_spans_take_no_wall_time_to_cross() -> None:
    # a clock that slept or read a wall clock could never reach a century of microseconds
    env = simsim.Environment()
    env.timeout(3_155_760_000_000_000)  # 100 years in microseconds
    env.run()
    assert env.now == 3_155_760_000_000_000


# --------------------------------------------------------------------------- equal-time order


def test_equal_time_events_run_in_scheduling_order() -> None:
    env = simsim.Environment()
    order: list[str] = []
    for tag in ("a", "b", "c", "d"):
        env.timeout(10).callbacks.append(_recorder(order, tag))
    env.run()
    assert order == ["a", "b", "c", "d"]
    assert env.now == 10


def test_equal_time_order_follows_scheduling_sequence_not_delay() -> None:
    env = simsim.Environment()
    order: list[str] = []

    # "early" is scheduled at t=0 for 0 + 10 = 10.
    env.timeout(10).callbacks.append(_recorder(order, "early"))

    def proc() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(4)
        # at t=4, schedule for 4 + 6 = 10: same time, but a later sequence number
        env.timeout(6).callbacks.append(_recorder(order, "late"))

    env.process(proc())
    env.run()
    assert order == ["early", "late"]
    assert env.now == 10


def test_urgent_before_normal_at_the_same_time() -> None:
    env = simsim.Environment()
    order: list[str] = []
    # a NORMAL event at t=0 scheduled first ...
    env.timeout(0).callbacks.append(_recorder(order, "normal"))

    def proc() -> Generator[simpy.Event, Any, None]:
        order.append("process-start")
        yield env.timeout(0)

    # ... then a process, whose Initialize event is URGENT at t=0: it still runs first
    env.process(proc())
    env.run()
    assert order == ["process-start", "normal"]


def test_urgent_before_normal_via_schedule() -> None:
    env = simsim.Environment()
    order: list[str] = []
    normal = env.event()
    urgent = env.event()
    normal.callbacks.append(_recorder(order, "normal"))
    urgent.callbacks.append(_recorder(order, "urgent"))
    # Process both as successful events at t = 0 + 5 = 5; NORMAL is scheduled first.
    for ev in (normal, urgent):
        ev._ok = True
        ev._value = None
    env.schedule(normal, NORMAL, 5)
    env.schedule(urgent, URGENT, 5)
    env.run()
    assert order == ["urgent", "normal"]
    assert env.now == 5


def test_equal_time_order_is_deterministic_across_runs() -> None:
    def scenario() -> list[tuple[int, str]]:
        env = simsim.Environment()
        out: list[tuple[int, str]] = []

        def proc(name: str, delays: list[int]) -> Generator[simpy.Event, Any, None]:
            for d in delays:
                yield env.timeout(d)
                out.append((env.now, name))

        env.process(proc("x", [3, 3, 4]))  # 3, 6, 10
        env.process(proc("y", [6, 4]))  # 6, 10
        env.process(proc("z", [10]))  # 10
        env.run()
        return out

    first = scenario()
    assert first == scenario()
    # t=0: the three Initialize events schedule x@3 (seq s1), y@6 (s2), z@10 (s3).
    # t=3: x resumes and schedules x@6 (s4).
    # t=6: y's s2 comes before x's s4; y schedules y@10 (s5), then x schedules x@10 (s6).
    # t=10: s3 (z), s5 (y), s6 (x).
    assert first == [(3, "x"), (6, "y"), (6, "x"), (10, "z"), (10, "y"), (10, "x")]
