"""The scenario model: a validated simulation, what to build and what to feed it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace

from simsim.backend import (
    Backend,
    FittedBackend,
    FittedBackendConfig,
    SimulatedBackend,
    SimulatedBackendConfig,
)
from simsim.clock import Environment
from simsim.engines import BatchingEngine, FastSimulationEngine, KvCacheConfig, SimulationEngine
from simsim.engines.base import EngineBase
from simsim.request import Request
from simsim.scenario.checker import ScenarioError
from simsim.scheduler import FcfsScheduler, Scheduler
from simsim.workloads import ClosedLoopWorkload, GeneratedWorkload, OpenLoopWorkload, check_seed

__all__ = [
    "ENGINES",
    "ENGINE_BUILDERS",
    "SCHEDULERS",
    "BatchingSpec",
    "Cancellation",
    "EngineBuilder",
    "RequestSpec",
    "Scenario",
    "Workload",
]

SCHEDULERS = ("fcfs",)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a scenario, before it becomes a :class:`Request`."""

    request_id: int
    arrival_time_us: int
    prompt_token_count: int
    max_output_tokens: int
    block_hashes: tuple[Hashable, ...] | None = None

    @classmethod
    def of(cls, request: Request) -> RequestSpec:
        """The spec of an existing request (its size, arrival and block hashes)."""
        return cls(
            request.request_id,
            request.arrival_time_us,
            request.prompt_token_count,
            request.max_output_tokens,
            request.block_hashes,
        )

    def to_request(self) -> Request:
        """A fresh pristine :class:`Request` with these fields."""
        return Request(
            self.request_id,
            self.arrival_time_us,
            self.prompt_token_count,
            self.max_output_tokens,
            block_hashes=self.block_hashes,
        )


@dataclass(frozen=True, slots=True)
class Cancellation:
    """Cancel *request_id* at *time_us* (skipped if it has finished by then)."""

    time_us: int
    request_id: int


Workload = OpenLoopWorkload | ClosedLoopWorkload


@dataclass(frozen=True, slots=True)
class BatchingSpec:
    """The ``[batching]``, ``[kv_cache]`` and ``[prefix_cache]`` tables: how the batching
    server is set up."""

    max_active_requests: int
    max_batch_tokens: int | None = None
    policy: str = "prefill_first"
    kv_cache: KvCacheConfig | None = None
    prefix_cache: bool = False

    def build(self, backend: Backend, scheduler: Scheduler, env: Environment) -> BatchingEngine:
        """A :class:`BatchingEngine` with these settings."""
        return BatchingEngine(
            backend,
            scheduler,
            max_active_requests=self.max_active_requests,
            max_batch_tokens=self.max_batch_tokens,
            policy=self.policy,
            kv_cache=self.kv_cache,
            prefix_cache=self.prefix_cache,
            env=env,
        )


@dataclass(frozen=True)
class Scenario:
    """A complete, validated simulation: what to build and what to feed it."""

    name: str = "scenario"
    engine: str = "single_slot"
    batching: BatchingSpec | None = None
    scheduler: str = "fcfs"
    backend: SimulatedBackendConfig | FittedBackendConfig = field(
        default_factory=SimulatedBackendConfig
    )
    requests: tuple[RequestSpec, ...] = ()
    workload: Workload | None = None
    cancellations: tuple[Cancellation, ...] = ()
    seed: int = 0
    source: str = "<scenario>"

    def with_seed(self, seed: int) -> Scenario:
        """The same scenario with another seed for its generated workload."""
        return replace(self, seed=check_seed(seed))

    def generated(self) -> GeneratedWorkload | None:
        """What an open-loop ``workload`` makes from the seed (``None`` otherwise).

        Generated once per :class:`Scenario` object and kept: checking the scenario's
        cancellations and running it use the same draw. The requests are specs' source
        only; :meth:`all_requests` is what an engine is fed.
        """
        return self._generated

    @functools.cached_property
    def _generated(self) -> GeneratedWorkload | None:
        if not isinstance(self.workload, OpenLoopWorkload):
            return None
        try:
            return self.workload.generate(self.seed)
        except (ValueError, OverflowError) as error:
            raise ScenarioError(self.source, "workload", str(error)) from None

    def build_engine(self, env: Environment | None = None) -> EngineBase:
        """A new engine of this scenario's kind (:data:`ENGINE_BUILDERS`), FCFS, idle."""
        return ENGINE_BUILDERS[self.engine](
            self, self.build_backend(), FcfsScheduler(), env or Environment()
        )

    def build_backend(self) -> Backend:
        """The cost model of the ``[backend]`` table: simulated (default) or fitted."""
        if isinstance(self.backend, FittedBackendConfig):
            return FittedBackend(self.backend)
        return SimulatedBackend(self.backend)

    def all_requests(self) -> list[RequestSpec]:
        """Listed, traced and generated requests, in id order; ids must be unique.

        A closed-loop workload's requests are made while the simulation runs and are
        not included. Worked out once per :class:`Scenario` object (a copy each call).
        """
        return list(self._all_requests)

    @functools.cached_property
    def _all_requests(self) -> tuple[RequestSpec, ...]:
        specs = list(self.requests)
        generated = self.generated()
        if generated is not None:
            specs.extend(RequestSpec.of(request) for request in generated.requests)
        seen: set[int] = set()
        for spec in specs:
            if spec.request_id in seen:
                raise ScenarioError(
                    self.source,
                    "requests",
                    f"request id {spec.request_id} appears twice (ids must be unique "
                    "across [[requests]], [trace] and [workload])",
                )
            seen.add(spec.request_id)
        specs.sort(key=lambda s: s.request_id)
        return tuple(specs)


EngineBuilder = Callable[[Scenario, Backend, Scheduler, Environment], EngineBase]
"""Builds a scenario's engine from its backend, a scheduler and an environment."""


def _single_slot(
    scenario: Scenario, backend: Backend, scheduler: Scheduler, env: Environment
) -> EngineBase:
    return SimulationEngine(backend, scheduler, env=env)


def _single_slot_fast(
    scenario: Scenario, backend: Backend, scheduler: Scheduler, env: Environment
) -> EngineBase:
    return FastSimulationEngine(backend, scheduler, env=env)


def _batching(
    scenario: Scenario, backend: Backend, scheduler: Scheduler, env: Environment
) -> EngineBase:
    if scenario.batching is None:
        raise ScenarioError(scenario.source, "batching", 'engine "batching" needs [batching]')
    return scenario.batching.build(backend, scheduler, env)


ENGINE_BUILDERS: Mapping[str, EngineBuilder] = {
    "single_slot": _single_slot,
    "single_slot_fast": _single_slot_fast,
    "batching": _batching,
}
"""``[scenario] engine`` names and how each engine is built: a new server is one entry."""

ENGINES = tuple(ENGINE_BUILDERS)
"""The engine names a scenario may choose, in the order the docs list them."""
