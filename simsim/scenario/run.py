"""Running a scenario: build its engine, submit its requests, schedule its cancellations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simsim.backend import SimulatedBackend
from simsim.clock import Environment
from simsim.engines import FastSimulationEngine, SimulationEngine
from simsim.engines.base import EngineBase
from simsim.scenario.model import Scenario
from simsim.scheduler import FcfsScheduler
from simsim.workloads import ClosedLoopWorkload

__all__ = ["run_scenario"]


def run_scenario(
    scenario: Scenario,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> EngineBase:
    """Build the scenario's engine, feed it, run it to the end and return it.

    Every listed, traced and generated request is submitted first, in id order; then
    the ``[[cancellations]]`` and the workload's patience deadlines are scheduled, and
    a closed-loop workload's users are started. So a cancellation at time T takes
    effect after the arrivals at T and before every other event at T; a request that is
    already finished by then is left alone. *progress*, if given, is called now and
    then with (requests admitted so far, requests known before the run).
    """
    specs = scenario.all_requests()
    env = Environment()
    backend = SimulatedBackend(scenario.backend)
    engine: EngineBase
    if scenario.engine == "batching":
        assert scenario.batching is not None
        engine = scenario.batching.build(backend, FcfsScheduler(), env)
    elif scenario.engine == "single_slot_fast":
        engine = FastSimulationEngine(backend, FcfsScheduler(), env=env)
    else:
        engine = SimulationEngine(backend, FcfsScheduler(), env=env)
    for spec in specs:
        engine.submit(spec.to_request())
    deadlines = [(c.time_us, c.request_id) for c in scenario.cancellations]
    generated = scenario.generated()
    if generated is not None:
        deadlines.extend(generated.cancellations)
    for time_us, request_id in sorted(deadlines):
        timer = env.timeout(time_us - env.now)
        timer.callbacks.append(_canceller(engine, request_id))
    if isinstance(scenario.workload, ClosedLoopWorkload):
        scenario.workload.start(env, engine, scenario.seed)
    total = max(len(specs), 1)
    if progress is None:
        engine.run()
        return engine
    step = engine.run_next_timestamp
    count = 0
    while step() is not None:
        count += 1
        if count % 4096 == 0:
            progress(min(len(engine.admission_log), total), total)
    progress(total, total)
    return engine


def _canceller(engine: EngineBase, request_id: int) -> Callable[[Any], None]:
    def cancel(_event: Any) -> None:
        if not engine.requests[request_id].is_terminal:
            engine.cancel_request(request_id)

    return cancel
