"""Running a scenario: build its engine, submit its requests, schedule its cancellations."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from simsim.request import Request
from simsim.scenario.checker import ScenarioError, out_of_memory_while
from simsim.scenario.model import RequestSpec, Scenario, Server
from simsim.wording import counted
from simsim.workloads import ClosedLoopWorkload, submit_with_deadlines

__all__ = ["check_scenario", "run_scenario"]


def run_scenario(
    scenario: Scenario,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Server:
    """Build the scenario's engine (or cluster), feed it, run it to the end and return it.

    Every listed, traced and generated request is submitted first, in id order; then
    the ``[[cancellations]]`` and the workload's patience deadlines are scheduled, and
    a closed-loop workload's users are started. So a cancellation at time T takes
    effect after the arrivals at T and before every other event at T; a request that is
    already finished by then is left alone. *progress*, if given, is called now and
    then with (requests admitted so far, requests known before the run).

    A request the engine refuses at submission (one that can never fit in the KV cache,
    say) raises :class:`ScenarioError` naming it, before anything runs.
    """
    specs = scenario.all_requests()
    deadlines = [(c.time_us, c.request_id) for c in scenario.cancellations]
    generated = scenario.generated()
    if generated is not None:
        deadlines.extend(generated.cancellations)
    engine = _submitted(scenario, specs, sorted(deadlines))
    env = engine.env
    if isinstance(scenario.workload, ClosedLoopWorkload):
        scenario.workload.start(env, engine, scenario.seed)
    total = max(len(specs), 1)
    with out_of_memory_while(scenario.source, lambda: _running(scenario, len(specs))):
        if progress is None:
            engine.run()
            return engine
        step = engine.run_next_timestamp
        admitted = _admitted_counter(engine)
        count = 0
        while step() is not None:
            count += 1
            if count % 4096 == 0:
                progress(min(admitted(), total), total)
    progress(total, total)
    return engine


def _running(scenario: Scenario, known: int) -> str:
    """What a run holds, for an out-of-memory message: its requests and their records."""
    what = f"running the simulation of {counted(known, 'request', grouped=True)}"
    if isinstance(scenario.workload, ClosedLoopWorkload):
        what += f" and {counted(scenario.workload.users, 'closed-loop user', grouped=True)}"
    return what + " (its records grow with every event)"


def check_scenario(scenario: Scenario) -> list[RequestSpec]:
    """Check that :func:`run_scenario` can start *scenario*; return its requests.

    Builds the scenario's engine and submits every listed, traced and generated request
    to it, without running it, so every rule the engine checks at submission (a request
    that can never fit in the KV cache, say) is checked too. A refused request raises
    :class:`ScenarioError` naming it. Closed-loop requests are made during the run and
    are not checked here.
    """
    specs = scenario.all_requests()
    _submitted(scenario, specs, ())
    return specs


def _admitted_counter(engine: Server) -> Callable[[], int]:
    """How many admissions *engine* has made so far (a cluster: its entry replicas')."""
    return lambda: engine.admitted_count


def _submitted(
    scenario: Scenario, specs: list[RequestSpec], deadlines: Sequence[tuple[int, int]]
) -> Server:
    """A new engine (or cluster) for *scenario* with every one of *specs* submitted and
    *deadlines* scheduled, not yet run."""
    engine = scenario.build()
    submitting = f"submitting the scenario's {counted(len(specs), 'request', grouped=True)}"

    def submit(spec: RequestSpec | Request) -> None:
        _submit(scenario, engine, spec)

    with out_of_memory_while(scenario.source, lambda: submitting):
        submit_with_deadlines(engine, specs, deadlines, submit=submit)
    return engine


def _submit(scenario: Scenario, engine: Server, spec: RequestSpec | Request) -> None:
    """Submit *spec*'s request; a refusal becomes a :class:`ScenarioError` naming it."""
    try:
        engine.submit(spec)
    except (ValueError, OverflowError) as error:
        key = f"request {spec.request_id}"
        message = str(error)
        # A cluster names the replica first: "replica 2: request 7 needs ...".
        head, colon, rest = message.partition(": ")
        if colon and head.startswith("replica ") and rest.startswith(f"{key} "):
            message = f"{rest.removeprefix(f'{key} ')} (on {head})"
        rule = message.removeprefix(f"{key} ")
        raise ScenarioError(scenario.source, key, rule) from None
