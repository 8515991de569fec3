"""The engines a scenario may name, each with a record of what it can do.

An ``[scenario] engine`` name picks an :class:`EngineKind` from :data:`ENGINE_KINDS`: how
to build the engine and which abilities it has. Everything that depends on an ability
(a fitted backend, a closed-loop workload, streaming tokens in ``simsim serve``,
calibration) asks the record through :func:`cannot` or :func:`require` instead of
comparing engine names, and each ability's rule is worded once, in :data:`RULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from simsim.clock import Environment
from simsim.engines import BatchingEngine, FastSimulationEngine, SimulationEngine
from simsim.engines.base import EngineBase
from simsim.registry import Registry
from simsim.scenario.checker import ScenarioError

if TYPE_CHECKING:
    from simsim.backend import Backend
    from simsim.scenario.model import Scenario
    from simsim.scheduler import Scheduler

__all__ = [
    "ENGINE_KINDS",
    "RULES",
    "Ability",
    "EngineBuilder",
    "EngineKind",
    "cannot",
    "kind_of",
    "require",
]

EngineBuilder = Callable[["Scenario", "Backend", "Scheduler", Environment], EngineBase]
"""Builds a scenario's engine from its backend, a scheduler and an environment."""

Ability = Literal["streams_tokens", "prices_context", "closed_loop"]
"""What an engine kind may or may not be able to do (a field of :class:`EngineKind`)."""

RULES: dict[str, tuple[str, str]] = {
    "streams_tokens": (
        "streaming tokens needs an engine that steps through them one by one",
        "skips decode steps and has no token events",
    ),
    "prices_context": (
        "a fitted backend prices each decode step from its context",
        "prices one decode step per request",
    ),
    "closed_loop": (
        "closed_loop needs an engine that takes submissions and cancellations while it runs",
        "gives the full engine's request table only when every submission and "
        "cancellation is set up before the run",
    ),
}
"""Each ability's rule, as (what needs it, what an engine without it does instead)."""


@dataclass(frozen=True, slots=True)
class EngineKind:
    """One ``[scenario] engine`` choice: how to build it and what it can do.

    ``streams_tokens``: it steps through each request's tokens (token events; ``simsim
    serve`` can stream them). ``prices_context``: it gives the backend every sequence's
    context (a fitted backend can price it, and ``simsim calibrate`` can fit it).
    ``closed_loop``: submissions and cancellations may come while it runs.
    ``serves_as``: the kind that stands in for it where it lacks an ability, with the
    same request table (``None``: none does). ``takes_backend``: a scenario's
    ``[backend]`` table prices its steps (``False``: the kind prices them itself from its
    own table, as ``vllm`` does from ``[vllm]``, and ``simsim calibrate`` cannot fit it).
    """

    name: str
    build: EngineBuilder
    engine_type: type[EngineBase]
    streams_tokens: bool = True
    prices_context: bool = True
    closed_loop: bool = True
    serves_as: str | None = None
    takes_backend: bool = True

    def __call__(
        self, scenario: Scenario, backend: Backend, scheduler: Scheduler, env: Environment
    ) -> EngineBase:
        """A new engine of this kind (``build``)."""
        return self.build(scenario, backend, scheduler, env)

    def can(self, ability: Ability) -> bool:
        """Whether this kind has *ability*."""
        able: bool = getattr(self, ability)
        return able


def _single_slot(
    scenario: Scenario, backend: Backend, scheduler: Scheduler, env: Environment
) -> EngineBase:
    return SimulationEngine(backend, scheduler, env=env, admission=scenario.admission)


def _single_slot_fast(
    scenario: Scenario, backend: Backend, scheduler: Scheduler, env: Environment
) -> EngineBase:
    return FastSimulationEngine(backend, scheduler, env=env, admission=scenario.admission)


def _batching(
    scenario: Scenario, backend: Backend, scheduler: Scheduler, env: Environment
) -> EngineBase:
    if scenario.batching is None:
        raise ScenarioError(scenario.source, "batching", 'engine "batching" needs [batching]')
    return scenario.batching.build(backend, scheduler, env, scenario.admission)


def _vllm(
    scenario: Scenario, backend: Backend, scheduler: Scheduler, env: Environment
) -> EngineBase:
    # The server builds its own physics backend from [vllm] (the scenario's backend is
    # the same model: Scenario.build_backend() gives it for other uses).
    if scenario.vllm is None:
        raise ScenarioError(scenario.source, "vllm", 'engine "vllm" needs [vllm]')
    return scenario.vllm.engine(scheduler, env=env, admission=scenario.admission)


class _EngineKinds(Registry[EngineKind]):
    """A registry of engine kinds; a plain builder registered is a kind that can do all."""

    __slots__ = ()

    def _entry(self, name: str, factory: EngineKind) -> EngineKind:
        if isinstance(factory, EngineKind):
            return factory
        return EngineKind(name, factory, EngineBase)


ENGINE_KINDS: Registry[EngineKind] = _EngineKinds("engine")
"""``[scenario] engine`` names and their :class:`EngineKind`, in the order the docs list
them; a new server is one entry."""

for _kind in (
    EngineKind("single_slot", _single_slot, SimulationEngine),
    EngineKind(
        "single_slot_fast",
        _single_slot_fast,
        FastSimulationEngine,
        streams_tokens=False,
        prices_context=False,
        closed_loop=False,
        serves_as="single_slot",
    ),
    EngineKind("batching", _batching, BatchingEngine),
    EngineKind("vllm", _vllm, BatchingEngine, takes_backend=False),
):
    ENGINE_KINDS.register(_kind.name, _kind)


def kind_of(engine: object) -> EngineKind | None:
    """The kind whose engines are exactly *engine*'s class (``None``: not a listed one)."""
    for kind in ENGINE_KINDS.values():
        if type(engine) is kind.engine_type:
            return kind
    return None


def cannot(engine: str, ability: Ability) -> str | None:
    """Why engine kind *engine* cannot do *ability* (the rule of :data:`RULES`), or
    ``None`` when it can (or *engine* is no known kind: that is reported elsewhere)."""
    kind = ENGINE_KINDS.get(engine)
    if kind is None or kind.can(ability):
        return None
    needs, instead = RULES[ability]
    message = f'{needs}; engine "{kind.name}" ({kind.engine_type.__name__}) {instead}'
    stand_in = ENGINE_KINDS.get(kind.serves_as or "")
    if stand_in is not None and stand_in.can(ability):
        message += (
            f': use engine = "{stand_in.name}" ({stand_in.engine_type.__name__}), which '
            "gives the same request table"
        )
    else:
        # A kind that prices its steps itself (vllm) takes no fitted backend either.
        able = [
            name
            for name, other in ENGINE_KINDS.items()
            if other.can(ability) and (ability != "prices_context" or other.takes_backend)
        ]
        message += ": use engine = " + " or ".join(f'"{name}"' for name in able)
    return message


def require(engine: str, ability: Ability) -> None:
    """Raise ``ValueError`` with the rule of :func:`cannot` unless *engine* can *ability*."""
    message = cannot(engine, ability)
    if message is not None:
        raise ValueError(message)
